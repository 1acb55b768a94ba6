"""kvmethods.runtime.batched_generation: a sample's members decoded in one batch give the tokens sequential decoding
gives, for every built-in method, with log-probs within 1e-3 (float32) before any divergence; the padded cache
masks each member's and head's padding; members leave the batch when they stop."""

from __future__ import annotations

import copy

import pytest
import torch

from kvmethods import Budget, MethodError, available_methods, get_method
from kvmethods.core.capabilities import Capability, decodes_alone
from kvmethods.runtime.batched_generation import (MEMBERS, PADDED, BatchRequest, batch_kind, batched_cache,
                                                  can_decode_in_batch, generate_batch)
from kvmethods.runtime.generation import generate, prefill
from kvmethods.runtime.shared_prefill import can_share_prefill, shared_prefill
from kvmethods.storage.ragged import RaggedLayer
from kvmethods.testing import tiny_model

TINY_HEAD = {"kivi": {"group_size": 8, "residual": 8}}  # the tiny model's head_dim is 16
LOGPROB_TOLERANCE = 1e-3


def _built(name: str):
    try:
        return get_method(name, **TINY_HEAD.get(name, {}))
    except MethodError:  # an optional backend is missing (hf_quantized's quanto)
        return None


BUILTINS = [name for name in available_methods() if (method := _built(name)) is not None]
SHARING = [name for name in BUILTINS if can_share_prefill(_built(name))]
# prefilled alone but batched (ThinK's thin keys, with KIVI too): decoding compressors and kvpress excluded
ALONE_PREFILL = [name for name in BUILTINS if not can_share_prefill(_built(name))
                 and not decodes_alone(_built(name).capabilities)]
BUDGETS = [Budget.parse("6"), Budget.parse("r0.5"), Budget.parse("64")]  # 64 keeps the whole prompt
# A window shorter than the prompt: adakv's heads keep uneven counts on the tiny model (ragged layers)
UNEVEN = [get_method("adakv", window=4), get_method("adakv", base="pyramidkv", window=4)]
COMPOSED = [get_method("snapkv+kivi", group_size=8, residual=8), get_method("think+kivi", group_size=8, residual=8)]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    return tiny_model(request.param, seed=3, qk_scale=4.0)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3, qk_scale=4.0)


def prompt(n=40, seed=None):
    return [int(t) for t in torch.randint(5, 200, (n,), generator=torch.Generator().manual_seed(seed or n))]


def copied(state):
    """A prefilled state to decode alone (decoding appends to its cache) while the batch reads the original."""
    return copy.deepcopy(state)


def first_divergence(label: str, batched, alone) -> str | None:
    """None when the tokens are equal; else where they part and both runs' log-probs of both tokens there."""
    for step, (a, b) in enumerate(zip(batched.tokens + [batched.stop_token], alone.tokens + [alone.stop_token])):
        if a != b:
            pb, pa = batched.logprobs[step], alone.logprobs[step]
            return (f"{label}: step {step}: batched {a} (log-p {float(pb[a]):.6f} vs {float(pb[b]):.6f} for {b}), "
                    f"alone {b} (log-p {float(pa[b]):.6f} vs {float(pa[a]):.6f} for {a})")
    return None


def _check_equal(label, batched, alone, steps_checked):
    divergence = first_divergence(label, batched, alone)
    assert divergence is None, divergence
    assert batched.tokens == alone.tokens and batched.stop_token == alone.stop_token, label
    n = len(alone.tokens) + (alone.stop_token is not None)
    assert batched.logprobs.shape[0] == n == alone.logprobs.shape[0]
    assert (batched.logprobs - alone.logprobs).abs().max() <= LOGPROB_TOLERANCE, label
    if alone.target_logprobs is not None:
        assert (batched.target_logprobs - alone.target_logprobs).abs().max() <= LOGPROB_TOLERANCE, label
    assert batched.kept_tokens_per_head == alone.kept_tokens_per_head, label
    assert (batched.kv_bytes_after, batched.kv_bytes_logical) == (alone.kv_bytes_after, alone.kv_bytes_logical)
    steps_checked.append(n)


@pytest.mark.parametrize("protocol", ["question_in_window", "query_agnostic"])
def test_every_builtin_decodes_the_same_tokens_in_a_batch_as_alone(model, protocol):
    """Every built-in at three budgets: sharing methods from one shared prefill, the others prefilled alone; one
    batch per kind (dense + ragged padded together, quantized / thin-key storages together) and the reference."""
    ids, context_len, new = prompt(), 30, 8
    sharing = [_built(name) for name in SHARING] + UNEVEN + COMPOSED[:1]
    requests = [(method, budget) for method in sharing for budget in BUDGETS]
    reference = generate(model, get_method("full"), Budget.parse("full"), ids, context_len, new, set(), protocol,
                         return_logprobs=True)
    targets = reference.tokens
    shared = shared_prefill(model, requests, ids, context_len, protocol)
    states = list(shared.selections)
    for method in [_built(name) for name in ALONE_PREFILL] + COMPOSED[1:]:
        for budget in BUDGETS:
            requests.append((method, budget))
            states.append(prefill(model, method, budget, ids, context_len, protocol))
    kinds: dict[str, list[int]] = {}
    for number, ((method, _), state) in enumerate(zip(requests, states)):
        if batch_kind(method, state) is not None:
            kinds.setdefault(batch_kind(method, state), []).append(number)
    assert set(kinds) == {PADDED, MEMBERS}
    batched_names = {requests[n][0].name for numbers in kinds.values() for n in numbers}
    assert batched_names >= {"snapkv", "pyramidkv", "adakv", "kvzip", "h2o", "tova", "kivi", "snapkv+kivi", "think",
                             "think+kivi"}
    assert any(isinstance(layer, RaggedLayer) and len(set(layer.kept_per_head)) > 1
               for n in kinds[PADDED] for layer in states[n].cache.layers), "no uneven heads: the per-head masks untested"
    checked: list[int] = []
    for kind, numbers in kinds.items():
        members = [BatchRequest(*requests[n], states[n]) for n in numbers]
        if kind == PADDED:  # the reference's full cache joins as one more member: dense, much longer than the others
            members.append(BatchRequest(get_method("full"), None, shared.reference))
        outputs = generate_batch(model, members, len(ids), new, set(), teacher_targets=targets, return_logprobs=True)
        for number, batched in zip(numbers, outputs):
            method, budget = requests[number]
            alone = generate(model, method, budget, ids, context_len, new, set(), protocol, teacher_targets=targets,
                             return_logprobs=True, prefilled=states[number])
            _check_equal(f"{method.name}@{budget.spec}", batched, alone, checked)
        if kind == PADDED:
            assert outputs[-1].tokens == reference.tokens
            assert (outputs[-1].logprobs - reference.logprobs).abs().max() <= LOGPROB_TOLERANCE
    assert len(checked) == sum(map(len, kinds.values())) and sum(checked) > len(checked)


def test_what_decodes_alone_is_a_capability_and_every_other_builtin_batches(model):
    ids = prompt()
    alone = {name for name in BUILTINS if decodes_alone(_built(name).capabilities)}
    assert {"rkv", "decoding"} <= alone and not {"snapkv", "adakv", "kvzip", "full", "kivi", "think"} & alone
    for name in BUILTINS:
        method = _built(name)
        if Capability.RUNS_PREFILL in method.capabilities:
            continue
        state = prefill(model, method, Budget.parse("6"), ids, 30, "query_agnostic")
        assert can_decode_in_batch(method, state) == (name not in alone), name
    kivi = prefill(model, _built("kivi"), Budget.parse("6"), ids, 30, "query_agnostic")
    assert batch_kind(_built("kivi"), kivi) == MEMBERS


def test_members_leave_the_batch_when_they_stop_and_the_others_go_on(llama):
    """Different eos ids and lengths: each member stops where it stops alone (max_new_tokens or its eos)."""
    ids, new = prompt(50, seed=7), 10
    methods = [(get_method("snapkv"), Budget.parse("5")), (get_method("streamingllm"), Budget.parse("12")),
               (get_method("adakv"), Budget.parse("8")), (get_method("h2o"), Budget.parse("4"))]
    alone_runs = [generate(llama, m, b, ids, 50, new, set(), "query_agnostic") for m, b in methods]
    eos = {alone_runs[0].tokens[4], alone_runs[2].tokens[2]}  # two members stop early, the others maybe not
    shared = shared_prefill(llama, methods, ids, 50, "query_agnostic")
    batched = generate_batch(llama, [BatchRequest(m, b, s) for (m, b), s in zip(methods, shared.selections)],
                             len(ids), new, eos, return_logprobs=True)
    alone = [generate(llama, m, b, ids, 50, new, eos, "query_agnostic", return_logprobs=True) for m, b in methods]
    assert [len(o.tokens) for o in batched] == [len(o.tokens) for o in alone]
    assert any(o.stop_token is not None for o in alone) and any(o.stop_token is None for o in alone)
    assert len({len(o.tokens) for o in alone}) > 1
    for (m, b), x, y in zip(methods, batched, alone):
        _check_equal(f"{m.name}@{b.spec}", x, y, [])
    assert all(o.decode_s > 0 for o in batched)


def test_the_padded_mask_hides_each_members_padding_per_head(llama):
    ids = prompt()
    methods = [(UNEVEN[0], Budget.parse("12")), (get_method("pyramidkv"), Budget.parse("10"))]
    shared = shared_prefill(llama, methods, ids, 40, "question_in_window")
    cache = batched_cache(shared.selections, room=4)
    uneven = [i for i, layer in enumerate(shared.selections[0].cache.layers)
              if isinstance(layer, RaggedLayer) and len(set(layer.kept_per_head)) > 1]
    assert uneven, "adakv kept its heads evenly everywhere: nothing ragged to test"
    layer = cache.layers[uneven[0]]
    lengths = [s.cache.layers[uneven[0]].tokens_per_head() if n == 0 else [s.cache.layers[uneven[0]].keys.shape[-2]] * 2
               for n, s in enumerate(shared.selections)]
    assert layer.lengths.tolist() == lengths and layer.prompt == max(map(max, lengths))
    mask = layer.attention_mask(1, 4)  # the first new token: the prompt part and itself
    assert mask.shape == (2, 4, 1, layer.prompt + 1)
    for b, heads in enumerate(lengths):
        for q_head in range(4):
            assert mask[b, q_head, 0, : layer.prompt].sum() == heads[q_head // 2]  # query heads share their KV head's row
    key = torch.zeros(2, 2, 1, layer.keys.shape[-1])
    layer.update(key, key)
    mask = layer.attention_mask(2, 4)  # two more after one stored: causal over the tail and themselves
    assert mask[:, :, :, layer.prompt:].tolist()[0][0] == [[True, True, False], [True, True, True]]
    layer.drop_tail()
    assert layer.get_seq_length() == layer.prompt


def test_a_decoding_steps_mask_follows_the_tail_growth_and_rows_that_leave(llama):
    """The one-token mask is a view of a mask built once per buffer: it must still be each head's own kept
    tokens then the whole tail, after steps, after the buffer grows past its room, and after rows leave."""
    ids = prompt()
    methods = [(UNEVEN[0], Budget.parse("12")), (get_method("pyramidkv"), Budget.parse("10")),
               (get_method("snapkv"), Budget.parse("6"))]
    shared = shared_prefill(llama, methods, ids, 40, "question_in_window")
    cache = batched_cache(shared.selections, room=2)
    layer = next(layer for layer in cache.layers if not layer.uniform_heads)

    def expected():
        # right-aligned: each head's kept tokens are the last of the prompt part
        prompt_part = torch.arange(layer.prompt) >= layer.prompt - layer.lengths.repeat_interleave(2, dim=1).unsqueeze(-1)
        return torch.cat([prompt_part, torch.ones(*prompt_part.shape[:2], layer.tail + 1, dtype=torch.bool)],
                         dim=-1).unsqueeze(2)

    for step in range(4):  # past the room of 2: the buffer grows
        assert torch.equal(layer.attention_mask(1, 4), expected()), step
        key = torch.zeros(layer.batch_size, 2, 1, layer.keys.shape[-1])
        layer.update(key, key)
    layer.keep_rows(torch.tensor([0, 2]))
    assert torch.equal(layer.attention_mask(1, 4), expected())
    assert layer.attention_mask(1, 4).shape == (2, 4, 1, layer.prompt + 5)


def test_members_of_samples_of_different_lengths_decode_in_one_batch_as_alone(llama):
    """Three prompts of 31, 40 and 52 tokens: their members (dense, ragged, quantized) in one batch per kind, each
    row at its own positions and teacher-forced on its own sample's reference, which decodes as a row of the same
    batch (targets_of); every row equals its sequential run."""
    protocol, new = "question_in_window", 8
    methods = [(get_method("snapkv"), Budget.parse("6")), (UNEVEN[0], Budget.parse("12")),
               (get_method("pyramidkv"), Budget.parse("r0.5")), (_built("kivi"), Budget.parse("8")),
               (COMPOSED[0], Budget.parse("10"))]
    padded: list[tuple] = []  # (sample, BatchRequest, label) rows of the padded batch; references are method None
    members: list[tuple] = []
    for sample, n in enumerate([31, 40, 52]):
        ids = prompt(n, seed=n)
        shared = shared_prefill(llama, methods, ids, n - 6, protocol)
        padded.append((sample, BatchRequest(get_method("full"), None, shared.reference, len(ids)), None))
        for (method, budget), state in zip(methods, shared.selections):
            row = (sample, BatchRequest(method, budget, state, len(ids)), (ids, n - 6, f"{method.name}@{budget.spec}"))
            (padded if batch_kind(method, state) == PADDED else members).append(row)
    assert {batch_kind(r.method, r.state) for _, r, _ in members} == {MEMBERS}

    def alone(row, targets):
        _, request, (ids, context_len, _) = row
        return generate(llama, request.method, request.budget, ids, context_len, new, set(), protocol,
                        teacher_targets=targets, return_logprobs=True, prefilled=copied(request.state))

    cut = {0: new, 1: 5, 2: 6}  # targets of different lengths (padded after their end; per length for KIVI)

    def references_of(outputs):  # each sample's reference row gives its members' targets
        produced = {sample: out.tokens[: cut[sample]] for (sample, _, label), out in zip(padded, outputs)
                    if label is None}
        return [None if label is None else produced[sample] for sample, _, label in padded]

    references = {}
    for sample, n in enumerate([31, 40, 52]):
        ids = prompt(n, seed=n)
        references[sample] = generate(llama, get_method("full"), Budget.parse("full"), ids, n - 6, new, set(), protocol,
                                      return_logprobs=True)
    expected = {id(r): alone(r, references[r[0]].tokens[: cut[r[0]]]) for r in padded + members if r[2] is not None}
    batched = generate_batch(llama, [r for _, r, _ in padded], None, new, set(), return_logprobs=True,
                             targets_of=references_of)
    checked: list[int] = []
    for row, out in zip(padded, batched):
        if row[2] is None:  # a reference row: its own sequential run
            reference = references[row[0]]
            assert out.tokens == reference.tokens and out.target_logprobs is None
            assert (out.logprobs - reference.logprobs).abs().max() <= LOGPROB_TOLERANCE
        else:
            _check_equal(row[2][2], out, expected[id(row)], checked)
    quantized = generate_batch(llama, [BatchRequest(r.method, r.budget, r.state, r.prompt_tokens,
                                                    references[sample].tokens[: cut[sample]])
                                       for sample, r, _ in members],
                               None, new, set(), return_logprobs=True)
    for row, out in zip(members, quantized):
        _check_equal(row[2][2], out, expected[id(row)], checked)
    assert len(checked) == 3 * len(methods)
    assert {r.state.next_position for _, r, _ in padded} == {31, 40, 52}  # each row decoded at its own positions


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "gpt_oss", "mistral"])
@pytest.mark.parametrize("protocol, context_len", [("question_in_window", 30), ("query_agnostic", 22)])
def test_members_with_sliding_window_layers_decode_in_a_batch_as_alone(family, protocol, context_len):
    """Sliding families (the hybrids' eager or sdpa attention, mistral sliding on every layer; window 12): members
    whose sliding layers are kept as their window or compressed within it (per-head positions), a head-adaptive
    one, one keeping the whole prompt and the reference's full cache decode 16 tokens (past the window) in one
    padded batch, each masked by its tokens' positions, and equal their sequential runs (teacher-forced too)."""
    from kvmethods.testing import WINDOW, family_model

    model = family_model(family, qk_scale=4.0, **({"sliding_window": WINDOW} if family == "mistral" else {}))
    ids, new = prompt(30, seed=11), 16
    requests = [(get_method("snapkv"), Budget.parse("6")), (get_method("streamingllm"), Budget.parse("8")),
                (get_method("snapkv").with_sliding_layers("compress"), Budget.parse("4")),
                (get_method("pyramidkv").with_sliding_layers("compress"), Budget.parse("5")),
                (get_method("adakv", window=4), Budget.parse("6")), (get_method("h2o"), Budget.parse("64"))]
    ids = [t % model.config.vocab_size for t in ids]
    reference = generate(model, get_method("full"), Budget.parse("full"), ids, context_len, new, set(), protocol,
                         return_logprobs=True)
    shared = shared_prefill(model, requests, ids, context_len, protocol)
    alone_states = [copied(state) for state in shared.selections]
    members = [BatchRequest(m, b, s) for (m, b), s in zip(requests, shared.selections)]
    members.append(BatchRequest(get_method("full"), None, shared.reference))
    assert {batch_kind(r.method, r.state) for r in members} == {PADDED}
    outputs = generate_batch(model, members, len(ids), new, set(), teacher_targets=reference.tokens,
                             return_logprobs=True)
    checked: list[int] = []
    for (method, budget), state, batched in zip(requests, alone_states, outputs):
        alone = generate(model, method, budget, ids, context_len, new, set(), protocol, return_logprobs=True,
                         teacher_targets=reference.tokens, prefilled=state)
        _check_equal(f"{family} {method.name}({method.sliding_layers})@{budget.spec}", batched, alone, checked)
    assert outputs[-1].tokens == reference.tokens
    assert (outputs[-1].logprobs - reference.logprobs).abs().max() <= LOGPROB_TOLERANCE
    assert len(checked) == len(requests) and min(checked) > WINDOW  # every member decoded past its window


def test_storages_of_their_own_with_sliding_windows_batch_as_members_as_alone():
    """KIVI alone and composed, ThinK + KIVI on gemma2: their sliding layers are full-precision windows (padded in
    the batch, masked by positions), their global layers their own storage (member layers); one batch, each equal
    to its sequential run, teacher-forced too, past the window."""
    from kvmethods.testing import WINDOW, family_model

    model = family_model("gemma2", qk_scale=4.0)
    ids, new = [t % model.config.vocab_size for t in prompt(40, seed=5)], 16
    kivi = dict(group_size=8, residual=8)
    requests = [(get_method("kivi", **kivi), Budget.parse("8")), (get_method("snapkv+kivi", **kivi), Budget.parse("10")),
                (get_method("snapkv+kivi", **kivi).with_sliding_layers("compress"), Budget.parse("6"))]
    states = list(shared_prefill(model, requests, ids, 40, "question_in_window").selections)
    requests.append((get_method("think+kivi", **kivi), Budget.parse("8")))
    states.append(prefill(model, requests[-1][0], requests[-1][1], ids, 40, "question_in_window"))
    assert {batch_kind(m, s) for (m, _), s in zip(requests, states)} == {MEMBERS}
    alone_states = [copied(state) for state in states]
    targets = generate(model, get_method("full"), Budget.parse("full"), ids, 40, new, set(), "question_in_window").tokens
    outputs = generate_batch(model, [BatchRequest(m, b, s) for (m, b), s in zip(requests, states)], len(ids), new,
                             set(), teacher_targets=targets, return_logprobs=True)
    checked: list[int] = []
    for (method, budget), state, batched in zip(requests, alone_states, outputs):
        alone = generate(model, method, budget, ids, 40, new, set(), "question_in_window", teacher_targets=targets,
                         return_logprobs=True, prefilled=state)
        _check_equal(f"{method.name}({method.sliding_layers})@{budget.spec}", batched, alone, checked)
    assert min(checked) > WINDOW


@pytest.mark.parametrize("family", ["gemma2", "mistral"])
def test_teacher_forcing_a_whole_prompt_member_masks_its_sliding_layers_by_the_window(family):
    """A member that keeps the whole prompt holds its sliding layers as plain dense layers, which only the model's
    windows (not a WindowLayer) say are sliding: teacher-forced on targets it did not produce, in a batch of its
    own (no WindowLayer beside it), its log-probs equal its sequential run's (they attended past the window)."""
    from kvmethods.testing import WINDOW, family_model

    model = family_model(family, qk_scale=4.0, **({"sliding_window": WINDOW} if family == "mistral" else {}))
    ids = [t % model.config.vocab_size for t in prompt(30, seed=11)]
    method, budget = get_method("h2o"), Budget.parse("64")
    state = shared_prefill(model, [(method, budget)], ids, 30, "question_in_window").selections[0]
    alone_state = copied(state)
    targets = [int(t) % model.config.vocab_size for t in prompt(8, seed=2)]
    batched = generate_batch(model, [BatchRequest(method, budget, state)], len(ids), 4, set(),
                             teacher_targets=targets)[0]
    alone = generate(model, method, budget, ids, 30, 4, set(), "question_in_window", teacher_targets=targets,
                     prefilled=alone_state)
    assert batched.tokens != targets[: len(batched.tokens)]  # teacher-forced, not its own decoding steps reused
    assert (batched.target_logprobs - alone.target_logprobs).abs().max() <= LOGPROB_TOLERANCE
