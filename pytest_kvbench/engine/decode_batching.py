"""How many members decode in one batch (`--kvbench-decode-batch auto|N`), of how many samples, and shrinking on OOM.

A sample's members decode in batches of at most N (kvmethods.runtime.batched_generation); `1` is the sequential
decoding of before, member by member. `auto` sizes the batch when it is formed:

- on CUDA, from the free memory (torch.cuda.mem_get_info, plus what torch's allocator holds cached but unused)
  against what one member costs in the batch: its padded cache (the longest member's bytes, padding included)
  with room for the new tokens, plus its log-probs (each decoding step's, and the teacher-forced pass's logits
  and log-softmax over the longest reference output of the batch, float32); half the free memory is used, the
  rest left to activations;
- on CPU, AUTO_CPU members, fewer where the host's available memory (MemAvailable) holds fewer by the same
  per-member count: a CPU's decoding step reads the weights once for the whole batch. AUTO_CPU is 128, which
  lets the real-model job's 33 members of 3 samples decode together (batching across samples: 0.82x the CPU
  time of one sample's batches, docs/performance.md), while a batch's padded attention grows with its rows.

An out-of-memory error in a batch is not a member's failure: the memory is freed, the limit halves for the
rest of the run (`shrunk` keeps one line saying so, the terminal summary shows it once) and the members are
decoded again in smaller batches, down to one, where an out-of-memory error fails the member as before.
No sample is lost: a batch re-decodes from the members' prefilled caches, which it never changes.

Batching across samples: as many whole groups (a sample's members) as one batch holds decode together
(`samples_together`); their compressed caches wait for the batch, so what waits is bounded by the limit.
"""

from __future__ import annotations

import os

import torch

from kvmethods.adapters.mixed_cache import is_state_layer, state_bytes, token_layers
from kvmethods.attention.gqa_attention import half_precision_on_cpu
from kvmethods.storage.batched import can_batch

from pytest_kvbench.input_values import MAX_DECODE_BATCH

AUTO = "auto"
AUTO_CPU = 128  # members per batch on CPU under auto (fewer where the available memory holds fewer)
AUTO_MEMORY_SHARE = 0.5  # of the free CUDA (or available host) memory, for the batch's caches and logits


def _cache_bytes(state) -> int:
    """Bytes a member's cache takes once padded into a batch: per layer, its longest head x heads x (K + V), at the
    dtype of its full-precision tensors. A quantized member (KIVI: tokens_per_head counts every token it holds)
    counts as that dense row too: in a batch it holds its keys and values dequantized, the batch's working memory
    (kvmethods/storage/batched.MemberBuffer), though it stores, and the records report, its codes. A
    half-precision cache on CPU decodes from a float32 copy (kvmethods' attention/gqa_attention.
    decoding_cache_dtype): 4 bytes an element, and a quantized member's row also in its own dtype (what it writes,
    mirrored into the float32 buffer)."""
    total = 0
    for layer in state.cache.layers:
        if is_state_layer(layer):  # a linear layer's fixed state (stacked into the batch as it is)
            total += state_bytes(layer)
            continue
        keys, values = layer.keys, getattr(layer, "values", None)
        width = keys.shape[-1] + (values.shape[-1] if values is not None else keys.shape[-1])  # MLA: V narrower
        longest = max(getattr(layer, "tokens_per_head", lambda: [keys.shape[-2]])())
        total += keys.shape[1] * longest * width * _element_bytes(layer, keys)
    return total


def _element_bytes(layer, keys: torch.Tensor) -> int:
    """What one element of a member's row takes in a batch (_cache_bytes)."""
    if not half_precision_on_cpu(keys):
        return keys.element_size()
    return 4 if can_batch(layer) else 4 + keys.element_size()  # the float32 copy (+ a member layer's own row)


def _host_available() -> int | None:
    """Bytes of host memory available (Linux MemAvailable; else free physical pages), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _member_bytes(states: list, new_tokens: int, targets: int, vocab: int) -> int:
    """What one member costs in a batch: the longest member's padded cache with room for the new tokens, plus
    its log-probs in float32: each decoding step's (new_tokens x vocabulary) and the teacher-forced pass's logits
    and their log-softmax (2 x targets x vocabulary; targets: the longest reference output of the batch)."""
    longest = max(_cache_bytes(s) for s in states)
    per_token = longest // max(1, max(s.next_position for s in states))
    return longest + per_token * max(new_tokens, targets) + 4 * (new_tokens + 2 * max(1, targets)) * vocab


def _cuda_free(device: torch.device) -> int:
    """Bytes a batch can take on a CUDA device: the driver's free memory plus what torch's caching allocator holds
    reserved but unallocated (a prefill's freed activations stay reserved, and mem_get_info does not count them)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + max(0, torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def _device(states: list) -> torch.device:
    """Where the members' caches are (tests fake a CUDA device here)."""
    return token_layers(states[0].cache)[0].keys.device if states else torch.device("cpu")


class DecodeBatching:
    """The batch limit of one worker: the setting, and what out-of-memory errors taught it."""

    def __init__(self, setting: int | str = 1) -> None:
        self.setting = setting
        self.limit: int | None = None if setting == AUTO else int(setting)
        self.shrunk: str | None = None  # one line for the terminal summary, once a batch ran out of memory
        self._first: int | None = None  # the batch size that first ran out of memory

    @property
    def sequential(self) -> bool:
        return self.limit == 1

    def size(self, states: list, new_tokens: int, targets: int, vocab: int) -> int:
        """Members per batch for these prefilled states (generation.PrefilledPrompt): the setting, or under
        auto the free memory's (CUDA) or AUTO_CPU, within the available host memory; never above a limit an
        out-of-memory error set."""
        if self.setting != AUTO:
            return max(1, self.limit)
        device = _device(states)
        member = max(1, _member_bytes(states, new_tokens, targets, vocab)) if states else 1
        if device.type != "cuda":
            available = _host_available() if states else None
            size = AUTO_CPU if available is None else min(AUTO_CPU, int(available * AUTO_MEMORY_SHARE // member))
        else:
            size = int(_cuda_free(device) * AUTO_MEMORY_SHARE // member)
        return max(1, min(size, MAX_DECODE_BATCH, self.limit or MAX_DECODE_BATCH))

    def samples_together(self, rows: int, members: int) -> int:
        """How many samples' groups of `members` members decode in the same batches (batching across samples)
        when a batch holds `rows` members (size()): as many whole groups as fit, at least one. Their compressed
        caches wait for the batch, so the caches held at once never exceed one batch's members (or one group)."""
        return max(1, rows // max(1, members))

    def out_of_memory(self, batch: int) -> int:
        """A batch of `batch` members ran out of memory: the limit halves (at least 1); returns it."""
        smaller = max(1, batch // 2)
        if self.limit is None or smaller < self.limit:
            self._first = self._first or batch
            self.shrunk = f"decode batch shrank from {self._first} to {smaller} members after out of memory"
            self.limit = smaller
        return self.limit
