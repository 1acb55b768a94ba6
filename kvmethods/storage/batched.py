"""Several sequences' compressed caches as one padded batch, so a group's members decode in one forward a step.

After a shared prefill every member of a sample holds its own cache: the same prompt, compressed its own way,
so the layers differ in length between members (snapkv vs pyramidkv), between layers (pyramidkv) and between
heads (adakv's ragged layers, `ragged.RaggedLayer`). `BatchedLayer` is a transformers cache layer (a
`DynamicLayer` subclass plugged into `DynamicCache.layers`, the public Cache API) holding one layer of B
members: each member's kept tokens per KV head, right-aligned (ending at position P, the longest of the batch,
zero padding before them), in one [B, kv_heads, P + room, dim] buffer, and the tokens added afterwards
(teacher-forced targets, decoded tokens) written after position P in place, so a decoding step copies nothing but
its own token.

`attention_mask()` gives the boolean mask sdpa takes, [B, 1 or query heads, q, P + tail + q]: member b's head h
sees its own kept tokens (the last lengths[b, h] slots before P), none of the padding, and the tokens after P
causally. Keys carry their RoPE rotation from the prefill, and attention does not depend on where a key
sits, so right-aligned kept tokens give each member exactly its own attention, up to float rounding of a
different shape (tests/kvmethods/test_batched_decode.py bounds it). Right-aligned, the keys a group of rows
attends are one contiguous slice, from the start of its longest row's tokens to the end: `buckets()` cuts the
rows into a few groups by their lengths, and a batch's attention on CPU (attention/gqa_attention.py) attends
each group over its own slice, not over the whole batch's padding. A member that stops leaves the batch
(`keep_rows`); the tail can be dropped back to the prompt (`drop_tail`) so the teacher-forced pass and the
greedy decoding share one padded copy. Plain dense layers, ragged layers and sliding layers' windows
(`WindowLayer`: kept or compressed, their tokens' positions per head masked by the window) batch this way
(`can_batch`).

Layers that store their tokens their own way (`CompactLayer`: KIVI's codes, ThinK's thin keys) batch with each
other instead (`MemberLayers`): each keeps its own layer, updated on its own row, so that what it quantizes
while decoding is quantized as alone; the batch keeps what they return padded, per layer, as its working memory
(`MemberBuffer`), and each member writes only what changed since its last step. Any other storage (a third
party's) decodes alone.
"""

from __future__ import annotations

import torch

from ..adapters.transformers_compat import DynamicLayer, mask_query_length
from .window_layer import WindowLayer
from .compact_layer import CompactLayer
from .ragged import RaggedLayer


def can_batch(layer) -> bool:
    """Whether a member's cache layer can join a batch: a plain dense layer, a ragged one or a sliding layer's
    window (WindowLayer), of one sequence."""
    return type(layer) in (DynamicLayer, RaggedLayer, WindowLayer) and layer.keys is not None \
        and layer.keys.shape[0] == 1


def _positions(layer, length: int) -> tuple[torch.Tensor, int]:
    """A batch-1 layer's token positions per KV head [heads, length], right-aligned (padding: position -1, never
    seen) and the position of its next token: a window's own; a dense layer of a sliding layer holds the
    uncompressed prompt."""
    if isinstance(layer, WindowLayer):
        held = layer.positions[0]
        padded = torch.full((held.shape[0], length), -1, dtype=torch.long, device=held.device)
        padded[:, length - held.shape[-1]:] = held
        return padded, layer.next_position
    n = layer.keys.shape[-2]
    positions = (torch.arange(length, device=layer.keys.device) - (length - n)).clamp_min(-1)
    return positions.expand(layer.keys.shape[1], -1), n


def buckets_of(lengths: list[int], most: int) -> list[tuple[int, int]]:
    """The rows cut into at most `most` runs of consecutive rows, (first, end) each, so that the slots they attend
    (each run: its rows x its longest row) are fewest: dynamic programming over the cut points, one step per run
    as whole-table tensor operations (it is redone whenever a member leaves a batch of up to 128 rows, on every
    layer: a Python double loop cost 0.5 s per such event at 132 rows)."""
    n = len(lengths)
    rows = torch.arange(n)
    after = rows.view(1, n) >= rows.view(n, 1)  # [first, last]: last >= first
    sizes = torch.tensor(lengths, dtype=torch.float64)
    longest = torch.where(after, sizes.expand(n, n), 0.0).cummax(dim=1).values  # max of lengths[first: last + 1]
    cost = torch.where(after, longest * (rows.view(1, n) - rows.view(n, 1) + 1), float("inf"))
    best = torch.full((n + 1,), float("inf"), dtype=torch.float64)  # best[end]: fewest slots of rows [0, end)
    best[0] = 0.0
    cuts = []
    for _ in range(most):  # at most one run more (best[0] = 0: fewer runs stay possible); ties: the earliest cut
        value, first = (best[:n].view(n, 1) + cost).min(dim=0)  # [last]: rows [0, last + 1)
        best = torch.cat([best[:1], value])
        cuts.append(first.tolist())
    runs, end, k = [], n, most - 1
    while end:
        first = cuts[k][end - 1]
        runs.append((first, end))
        end, k = first, k - 1
    return runs[::-1]


def _head_sequences(layer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per KV head, the tokens a batch-1 layer holds ([n_h, dim] keys and values)."""
    if isinstance(layer, RaggedLayer):
        return ([torch.cat([own, tail]) for own, tail in zip(layer.head_keys, layer.keys[0])],
                [torch.cat([own, tail]) for own, tail in zip(layer.head_values, layer.values[0])])
    return list(layer.keys[0]), list(layer.values[0])


def _lengths(layer) -> list[int]:
    """Tokens each KV head of a batch-1 layer holds."""
    if isinstance(layer, RaggedLayer):
        return layer.tokens_per_head()
    return [layer.keys.shape[-2]] * layer.keys.shape[1]


class BatchedLayer(DynamicLayer):
    """One layer of B members' caches: padded kept tokens [B, heads, P, dim] + in-place room for new tokens.

    A sliding layer (`window`: the tokens a query sees, itself included) also knows each member's token positions
    per head and its next position: a token is masked once it is out of the query's window, as WindowLayer's own
    mask does (the batch drops no token while decoding: its buffer holds the prompt and the room anyway)."""

    MASK_ROOM = 64  # slots a decoding mask built past the buffer's room covers ahead

    def __init__(self, layers: list, room: int, window: int | None = None, dtype: torch.dtype | None = None):
        """layers: each member's layer (can_batch); room: new tokens the buffer holds before it must grow; window:
        the layer's sliding window (None: global; a member's WindowLayer says it too); dtype: the buffer's, where
        not the members' (a decoding batch's float32 working copy, gqa_attention.decoding_cache_dtype)."""
        super().__init__()
        first = layers[0].keys
        heads, dim = first.shape[1], first.shape[-1]
        lengths = torch.tensor([[int(n) for n in _lengths(layer)] for layer in layers], dtype=torch.long)
        self.prompt = int(lengths.max())
        self.lazy_initialization(first, first)
        dtype = dtype or first.dtype
        self._keys = first.new_zeros(len(layers), heads, self.prompt + room, dim, dtype=dtype)
        self._values = first.new_zeros(len(layers), heads, self.prompt + room, layers[0].values.shape[-1],
                                       dtype=dtype)  # MLA: values narrower
        for b, layer in enumerate(layers):
            if isinstance(layer, RaggedLayer):  # each head its own length
                for h, (k, v) in enumerate(zip(*_head_sequences(layer))):
                    self._keys[b, h, self.prompt - k.shape[0]: self.prompt] = k
                    self._values[b, h, self.prompt - v.shape[0]: self.prompt] = v
            else:  # one copy for all heads
                self._keys[b, :, self.prompt - layer.keys.shape[-2]: self.prompt] = layer.keys[0]
                self._values[b, :, self.prompt - layer.values.shape[-2]: self.prompt] = layer.values[0]
        self.lengths = lengths.to(first.device)  # [B, heads] kept tokens of each member's head
        self.window = next((layer.window for layer in layers if isinstance(layer, WindowLayer)), window)
        self.positions = self.next_positions = None
        if self.window is not None:  # [B, heads, P] positions of the kept tokens, [B] the next token's
            held = [_positions(layer, self.prompt) for layer in layers]
            self.positions = torch.stack([p for p, _ in held]).to(first.device)
            self.next_positions = torch.tensor([n for _, n in held], dtype=torch.long, device=first.device)
        self.uniform_heads = self._uniform()  # one mask row serves all heads
        self._buckets: list[tuple[int, int, int]] | None = None
        self.tail = 0
        self._step_mask: torch.Tensor | None = None  # a decoding step's mask over the whole buffer (_decoding_mask)
        self._set_views()

    def _uniform(self) -> bool:
        same = bool((self.lengths == self.lengths[:, :1]).all())
        return same and (self.positions is None or bool((self.positions == self.positions[:, :1]).all()))

    def _set_views(self) -> None:
        self.keys = self._keys[:, :, : self.prompt + self.tail]
        self.values = self._values[:, :, : self.prompt + self.tail]

    @property
    def batch_size(self) -> int:
        return int(self._keys.shape[0])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        end = self.prompt + self.tail + new
        if end > self._keys.shape[-2]:  # out of room: grow (a teacher-forced pass longer than the decoding)
            grow = end - self._keys.shape[-2]
            self._keys, self._values = (torch.cat([t, t.new_zeros(*t.shape[:2], grow, t.shape[-1])], dim=-2)
                                        for t in (self._keys, self._values))  # MLA: values narrower than keys
        self._keys[:, :, end - new: end] = key_states
        self._values[:, :, end - new: end] = value_states
        self.tail += new
        self._set_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.prompt + self.tail

    def get_mask_sizes(self, query, *args, **kwargs) -> tuple[int, int]:
        return self.get_seq_length() + mask_query_length(query), 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a batched cache layer is cut back with drop_tail()")

    def drop_tail(self) -> None:
        """Back to the members' prompt caches: the tokens added since are forgotten (their slots reused)."""
        self.tail = 0
        self._set_views()

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the members at `rows` stay in the batch (the others stopped)."""
        self._keys, self._values = self._keys[rows], self._values[rows]
        self.lengths = self.lengths[rows.to(self.lengths.device)]
        if self.positions is not None:
            self.positions = self.positions[rows.to(self.positions.device)]
            self.next_positions = self.next_positions[rows.to(self.next_positions.device)]
        self.uniform_heads = self._uniform()
        self._step_mask = self._buckets = None
        self._set_views()

    MOST_BUCKETS = 4  # groups of rows a batch's attention is cut into (one sdpa call each)

    def buckets(self) -> list[tuple[int, int, int]]:
        """(first row, end row, first slot) of each group of consecutive rows that attends on its own: the slots
        from `first slot` on hold every kept token of its rows (right-aligned), the tail and the new tokens."""
        if self._buckets is None:
            longest = self.lengths.max(dim=1).values.tolist()
            self._buckets = [(first, end, self.prompt - max(longest[first:end]))
                             for first, end in buckets_of(longest, self.MOST_BUCKETS)]
        return self._buckets

    def attention_mask(self, query_length: int, num_query_heads: int) -> torch.Tensor:
        """[B, 1 or num_query_heads, query_length, P + tail + query_length] bool (True: attend) for the next
        query_length tokens (asked before update() stores them): each member's head sees its own kept tokens,
        then the tail and the new tokens causally; in a sliding layer, only those within each query's window.
        A decoding step's (one token, global layers) is a view of one mask built per buffer, not rebuilt per step."""
        if query_length == 1 and self.window is None:
            return self._decoding_mask(num_query_heads)[..., : self.prompt + self.tail + 1]
        device = self._keys.device
        prompt = self._prompt_visible()  # [B, H', P]
        rows = torch.arange(query_length, device=device).unsqueeze(-1)
        causal = torch.arange(self.tail + query_length, device=device) <= rows + self.tail  # [q, tail + q]
        batch, heads = prompt.shape[:2]
        prompt = prompt.unsqueeze(2).expand(-1, -1, query_length, -1)
        if self.window is not None:
            positions = self.positions[:, :1] if self.uniform_heads else self.positions  # [B, H', P]
            queries = self.next_positions.view(-1, 1, 1) + self.tail + torch.arange(query_length, device=device)
            prompt = prompt & (queries.unsqueeze(-1) - positions.unsqueeze(2) < self.window)  # [B, H', q, P]
            tail = torch.arange(self.tail + query_length, device=device)
            causal = causal & (rows + self.tail - tail < self.window)
        visible = torch.cat([prompt, causal.expand(batch, heads, -1, -1)], dim=-1)
        return self._per_query_head(visible, num_query_heads)

    def _prompt_visible(self) -> torch.Tensor:
        """[B, 1 or kv heads, P]: which padded prompt slots each member's head holds (the last lengths ones)."""
        lengths = self.lengths[:, :1] if self.uniform_heads else self.lengths  # [B, H']
        return torch.arange(self.prompt, device=self._keys.device) >= self.prompt - lengths.unsqueeze(-1)

    @staticmethod
    def _per_query_head(visible: torch.Tensor, num_query_heads: int) -> torch.Tensor:
        heads = visible.shape[1]
        if heads > 1:  # query heads share KV heads, as transformers' repeat_kv
            visible = visible.repeat_interleave(num_query_heads // heads, dim=1)
        return visible

    def _decoding_mask(self, num_query_heads: int) -> torch.Tensor:
        """[B, 1 or num_query_heads, 1, buffer length]: the prompt slots each head holds, then every later slot
        (a decoding token sees the whole tail); built once per buffer and rows."""
        mask, needed = self._step_mask, self.prompt + self.tail + 1
        if mask is None or mask.shape[-1] < needed or (mask.shape[1] > 1 and mask.shape[1] != num_query_heads):
            prompt = self._prompt_visible()  # room for this step's token even where the buffer must still grow
            later = prompt.new_ones(*prompt.shape[:2], max(self._keys.shape[-2], needed + self.MASK_ROOM) - self.prompt)
            mask = self._per_query_head(torch.cat([prompt, later], dim=-1).unsqueeze(2), num_query_heads)
            self._step_mask = mask
        return mask


def can_batch_as_members(layer) -> bool:
    """Whether a member's layer stores its tokens its own way (CompactLayer: KIVI's codes, ThinK's thin keys) and
    can join a batch of such layers, each updated on its own row (MemberLayers)."""
    return isinstance(layer, CompactLayer) and layer.values is not None and layer.values.shape[0] == 1


class MemberBuffer:
    """One layer's padded keys and values of a batch of member layers: the batch's working memory.

    Each member layer writes what it returns into its row (CompactLayer.update_into) and the buffer is kept
    between steps, so that a member writes only what changed since its last step: KIVI dequantizes each of its
    quantized groups once per batch (the groups quantized while decoding once they are) and copies its
    full-precision window, instead of dequantizing its whole store at every step. The stored bytes (the records'
    KV figures) stay the codes; this buffer is the batch's, counted by the batch sizing as a dense row at the
    model's dtype (pytest_kvbench/engine/decode_batching.py). Alone (batch 1, generation.generate) a KIVI layer
    dequantizes at every step and keeps nothing. Padding after a member's tokens is zeros (masked, but a stale
    value could be non-finite): a row's tokens only grow, and what lies past them is cleared if they ever do not.

    With a `dtype` other than the members' (a decoding batch's float32 working copy,
    gqa_attention.decoding_cache_dtype) the members still write in their own dtype, rounded as they are alone,
    and what each wrote is mirrored into a buffer of that dtype, which attention reads."""

    ROOM = 64  # positions allocated past the longest member when no room is given

    def __init__(self, room: int = ROOM, dtype: torch.dtype | None = None):
        self.room = max(1, room)
        self.dtype = dtype  # the mirror's, where attention reads another dtype than the members write
        self.keys: torch.Tensor | None = None  # [B, heads, capacity, dim]
        self.values: torch.Tensor | None = None
        self.mirror: tuple[torch.Tensor, torch.Tensor] | None = None  # keys and values in `dtype`
        self.filled: list[int] = []  # positions each row holds
        self.stable: list[tuple[int, int]] = []  # leading keys and values each row need not write again

    def views(self, like: torch.Tensor, batch: int, length: int, held: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """[batch, heads, length, dim] views of the buffers the members write (zeroed when new, with room for
        `room` tokens after the `held` the longest member held before this update; grown keeping what they
        hold)."""
        heads, dim = like.shape[1], like.shape[-1]
        if self.keys is None or self.keys.shape[0] != batch or self.keys.shape[1] != heads or \
                self.keys.shape[-1] != dim or self.keys.dtype != like.dtype:
            capacity = max(length, held + self.room)
            self.keys = like.new_zeros(batch, heads, capacity, dim)
            self.values = like.new_zeros(batch, heads, capacity, dim)
            self.mirror = None if self.dtype in (None, like.dtype) else \
                (torch.zeros_like(self.keys, dtype=self.dtype), torch.zeros_like(self.values, dtype=self.dtype))
            self.filled, self.stable = [0] * batch, [(0, 0)] * batch
        elif self.keys.shape[2] < length:  # out of room: grow, what the rows hold kept
            grow = length + self.room - self.keys.shape[2]
            self.keys, self.values = (self._grown(t, grow) for t in (self.keys, self.values))
            if self.mirror is not None:
                self.mirror = tuple(self._grown(t, grow) for t in self.mirror)
        return self.keys[:, :, :length], self.values[:, :, :length]

    @staticmethod
    def _grown(tensor: torch.Tensor, grow: int) -> torch.Tensor:
        return torch.cat([tensor, tensor.new_zeros(*tensor.shape[:2], grow, tensor.shape[-1])], dim=-2)

    def read(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What attention reads: [batch, heads, length, dim] views of the mirror, or of the buffers."""
        keys, values = self.mirror if self.mirror is not None else (self.keys, self.values)
        return keys[:, :, :length], values[:, :, :length]

    def done(self, row: int, length: int, stable: tuple[int, int], written: tuple[int, int] = (0, 0)) -> None:
        """Row `row` now holds `length` positions, of which the first `stable` keys and values stay as they are;
        it wrote its keys and values from `written` on (mirrored)."""
        tensors = [(self.keys, self.values)] + ([self.mirror] if self.mirror is not None else [])
        if self.filled[row] > length:
            for keys, values in tensors:
                keys[row, :, length: self.filled[row]].zero_()
                values[row, :, length: self.filled[row]].zero_()
        if self.mirror is not None:
            self.mirror[0][row, :, written[0]: length] = self.keys[row, :, written[0]: length]
            self.mirror[1][row, :, written[1]: length] = self.values[row, :, written[1]: length]
        self.filled[row], self.stable[row] = length, stable

    def keep_rows(self, rows: list[int]) -> None:
        """Only these rows stay (the other members stopped)."""
        if self.keys is not None:
            index = torch.tensor(rows, device=self.keys.device)
            self.keys, self.values = self.keys[index], self.values[index]
            if self.mirror is not None:
                self.mirror = (self.mirror[0][index], self.mirror[1][index])
            self.filled = [self.filled[row] for row in rows]
            self.stable = [self.stable[row] for row in rows]


class MemberLayers(DynamicLayer):
    """One layer of B members whose storage is their own (quantized, channel-pruned): each member's layer takes
    its own row of the new tokens and returns its keys and values exactly as it does alone (its quantization of
    the tokens leaving its window included), written into row b of the layer's MemberBuffer (kept between steps:
    each member writes only what changed), padded after the member's tokens; `attention_mask()` hides the
    padding, each member's new tokens at the end of its own tokens."""

    def __init__(self, layers: list, buffer: MemberBuffer | None = None):
        super().__init__()
        self.members = list(layers)
        self.buffer = buffer if buffer is not None else MemberBuffer()
        self.lazy_initialization(layers[0].values, layers[0].values)

    @property
    def batch_size(self) -> int:
        return len(self.members)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        held = max(layer.get_seq_length() for layer in self.members)
        length = held + key_states.shape[-2]
        keys, values = self.buffer.views(key_states, len(self.members), length, held)
        for b, layer in enumerate(self.members):
            written = self.buffer.stable[b]
            n, stable = layer.update_into(key_states[b: b + 1], value_states[b: b + 1], keys[b: b + 1],
                                          values[b: b + 1], written)
            self.buffer.done(b, n, stable, written)
        return self.buffer.read(length)

    def get_seq_length(self) -> int:
        return max(layer.get_seq_length() for layer in self.members)

    def get_mask_sizes(self, query, *args, **kwargs) -> tuple[int, int]:
        return self.get_seq_length() + mask_query_length(query), 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a batch of member layers cannot be cropped")

    def keep_rows(self, rows: torch.Tensor) -> None:
        self.members = [self.members[int(row)] for row in rows]
        self.buffer.keep_rows([int(row) for row in rows])

    def attention_mask(self, query_length: int, num_query_heads: int) -> torch.Tensor:
        """[B, 1, query_length, longest + query_length] bool: member b sees its own tokens, its new ones causally
        (they come last in what its layer returns), none of the padding after them."""
        device = self.members[0].values.device
        held = torch.tensor([layer.get_seq_length() for layer in self.members], device=device)  # before the update
        columns = torch.arange(int(held.max()) + query_length, device=device)
        rows = torch.arange(query_length, device=device)
        visible = columns[None, None, :] <= held[:, None, None] + rows[None, :, None]  # [B, q, columns]
        return visible.unsqueeze(1)
