"""One benchmark item's work: samples -> prompts -> compressed generation -> scores -> a record.

Everything expensive that does not depend on the method is shared between items through caches
that live for the whole worker process: the model (models.py), the task's samples and tokenized
prompts, the full-cache reference pass used for fidelity (fidelity.py), and the prefill itself:
one forward per sample gives the reference's cache and the compressed cache of every planned item
of the reference group (shared_prefills.py); each item then decodes its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvmethods import Budget
from kvmethods.generation import GROUP_PROTOCOLS
from pytest_kvbench.engine.fidelity import ReferenceCache, compare, make_reference
from pytest_kvbench.engine.models import LoadedModel, ModelCache
from pytest_kvbench.engine.protocol_runs import Generation, by_context_and_turn, generations, group_position
from pytest_kvbench.engine.shared_prefills import PreparedPrompt, SharedPrefills
from pytest_kvbench.results import record as records
from pytest_kvbench.wiring.grid import FULL_METHOD, Case, Grid

NO_COMPRESSION = Budget("ratio", 0.0)  # the budget the full-cache reference runs with: remove nothing


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _prefill_split(prepared: PreparedPrompt | None, shared_reference=None) -> dict:
    """The labelled parts of a sample's prefill_ms when it came from a shared prefill (else None):
    the shared forward, spent once per sample for the whole reference group, and the item's own part."""
    if prepared is not None:
        return {"shared_prefill_ms": prepared.shared_s * 1000.0, "compression_ms": prepared.own_s * 1000.0}
    if shared_reference is not None:
        return {"shared_prefill_ms": shared_reference.prefill_s * 1000.0, "compression_ms": 0.0}
    return {"shared_prefill_ms": None, "compression_ms": None}


class Runner:
    """Runs cases; one instance per worker process (held by the session)."""

    def __init__(self, grid: Grid, run_id: str, timeout_s: float | None = None, share_prefill: bool = True) -> None:
        self.grid = grid
        self.shared = SharedPrefills(share_prefill)
        self.run_id = run_id
        self.timeout_s = timeout_s
        self.models = ModelCache()
        self.references = ReferenceCache()
        self._samples: dict[tuple, list] = {}
        self._prompts: dict[tuple, Any] = {}
        self._devices: dict[str, dict] = {}

    # -- shared inputs -------------------------------------------------------------------------
    def _load_samples(self, case: Case, task, loaded: LoadedModel) -> list:
        key = (case.model, case.task, case.samples, case.seed, case.context_length, self.grid.data_dir)
        if key not in self._samples:
            self._samples[key] = task.load_samples(
                loaded.tokenizer,
                n=case.samples,
                seed=case.seed,
                data_dir=self.grid.data_dir,
                context_length=case.context_length,
            )
        return self._samples[key]

    def _max_prompt_tokens(self, task, loaded: LoadedModel) -> int | None:
        if self.grid.max_prompt_tokens:
            return self.grid.max_prompt_tokens
        if loaded.max_positions:
            return loaded.max_positions - task.max_new_tokens
        return None

    def _prompt(self, case: Case, task, sample, loaded: LoadedModel):
        key = (case.model, case.task, case.seed, case.context_length, sample.id)
        if key not in self._prompts:
            self._prompts[key] = task.build_prompt(sample, loaded.tokenizer, self._max_prompt_tokens(task, loaded))
        return self._prompts[key]

    def _reference_key(self, case: Case, sample) -> tuple:
        return (case.model, case.task, case.seed, case.context_length, sample.id, case.protocol)

    def _reference(self, case: Case, task, sample, prompt, loaded: LoadedModel):
        """The full-cache pass of a sample, computed once per run and shared by every method."""
        if self.shared.enabled:
            return self.references.get(self._reference_key(case, sample),
                                       lambda: self._share_prefill(case, task, sample, prompt, loaded))
        return self.references.get(self._reference_key(case, sample),
                                   lambda: self._decode_reference(case, task, sample, prompt, loaded))

    def _decode_reference(self, case: Case, task, sample, prompt, loaded: LoadedModel, prefilled=None,
                          prefill_s: float = 0.0):
        from kvmethods import get_method
        from kvmethods.generation import generate
        from pytest_kvbench.engine.finite_logits import check_logits_finite

        result = generate(loaded.model, get_method(FULL_METHOD), NO_COMPRESSION, prompt.input_ids,
                          prompt.context_len, task.max_new_tokens, loaded.eos_token_ids, case.protocol,
                          return_logprobs=True, prefilled=prefilled)
        if prefilled is not None:
            result.prefill_s = prefill_s
        # Methods are teacher-forced on the reference's whole output, the stopping eos included.
        target = list(result.tokens) + ([result.stop_token] if result.stop_token is not None else [])
        logp, result.logprobs = result.logprobs, None
        check_logits_finite(logp, f"full-cache reference of {case.task} sample {sample.id}")
        return make_reference(result, target, logp)

    # -- the shared prefill --------------------------------------------------------------------
    def _method(self, case: Case):
        from kvmethods import get_method

        params = dict(case.method.params)
        method = get_method(case.method.name, **params)
        if "seed" in method.params() and "seed" not in params:  # seeded methods follow the run's seed
            method = get_method(case.method.name, **params, seed=case.seed)  # wrappers (prefill_chunk) too
        return method

    def _shares(self, case: Case) -> bool:
        from kvmethods.shared_prefill import can_share_prefill

        return case.method.name != FULL_METHOD and can_share_prefill(self._method(case))

    def _share_prefill(self, case: Case, task, sample, prompt, loaded: LoadedModel):
        """One prefill of the sample for the reference and every planned item of the group still to
        run; their caches wait in self.shared. Returns the reference, made from the full cache."""
        members = [c for c in self.shared.members(case, sample.id, self._shares) if self._shares(c)]
        shared = self._prefill_for(members, task, prompt, loaded, case.protocol)
        for member, state, own_s, error in zip(members, shared.selections, shared.own_s, shared.errors):
            if error is not None and member == case:
                raise error
            if error is None:  # a failing method fails as its own item, when it prefills alone
                self.shared.keep(member, sample.id, PreparedPrompt(state, shared.forward_s, own_s))
        full, forward_s, shared = shared.reference, shared.forward_s, None  # the selections live in self.shared
        return self._decode_reference(case, task, sample, prompt, loaded, full, forward_s)

    def _prefill_for(self, members: list[Case], task, prompt, loaded: LoadedModel, protocol: str):
        from kvmethods.shared_prefill import shared_prefill

        return shared_prefill(loaded.model, [(self._method(c), c.budget) for c in members], prompt.input_ids,
                              prompt.context_len, protocol, len(prompt.input_ids) + task.max_new_tokens)

    def _prepared(self, case: Case, task, sample, prompt, loaded: LoadedModel) -> PreparedPrompt:
        """This item's compressed prompt of the sample, from the group's shared prefill (run now if
        no earlier item made it)."""
        prepared = self.shared.take(case, sample.id)
        if prepared is None:
            key = self._reference_key(case, sample)
            if key in self.references:  # the reference is decoded already; its full cache is dropped
                self._share_prefill(case, task, sample, prompt, loaded)
            else:
                self.references.get(key, lambda: self._share_prefill(case, task, sample, prompt, loaded))
            prepared = self.shared.take(case, sample.id)
        return prepared

    # -- the item ------------------------------------------------------------------------------
    def run(self, case: Case, progress: Callable[[int, int], None] | None = None) -> dict:
        """The item's record; out of memory raises ItemOutOfMemory after the memory is freed.
        progress(samples done, samples in all) is called after each sample."""
        from pytest_kvbench.engine.out_of_memory import fail_on_out_of_memory

        try:
            with fail_on_out_of_memory(case.id):
                return self._run(case, progress or (lambda done, total: None))
        finally:
            self.shared.finish(case)  # caches left for this item (it failed mid-way) are freed

    def _run(self, case: Case, progress: Callable[[int, int], None]) -> dict:
        from kvmethods.generation import record_fields
        from pytest_kvbench.engine.hardware.item_meter import ItemMeter
        from pytest_kvbench.engine.time_limit import item_time_limit
        from pytest_kvbench.tasks import get_task

        started = time.perf_counter()
        task = get_task(case.task)
        method = self._method(case)
        sharing = self.shared.enabled and self._shares(case)
        budget = NO_COMPRESSION if case.budget == records.FULL_CACHE else case.budget
        loaded, loaded_now = self.models.get(case.model, self.grid.dtype, self.grid.attn_implementation)
        samples = self._load_samples(case, task, loaded)
        rows: list[dict] = []
        scores: list[float] = []
        with item_time_limit(self.timeout_s), ItemMeter(loaded.device) as meter:
            if case.protocol in GROUP_PROTOCOLS:  # several questions on one compressed context: no shared prefill
                produced = ((made, {}) for made in generations(self, case, task, method, budget, loaded, samples))
            else:
                produced = self._single_prompts(case, task, method, budget, loaded, samples, sharing)
            for (sample, result, kl, agreement, context, turn), timing in produced:
                prediction = loaded.tokenizer.decode(result.tokens, skip_special_tokens=True)
                answer = self._follow_up(task, sample, prediction, method, budget, loaded, case.protocol)
                first_output = {} if answer is None else {"first_output": prediction}
                prediction = prediction if answer is None else answer
                score = float(task.score(prediction, sample))
                scores.append(score)
                rows.append({
                    "id": sample.id,
                    "prediction": prediction,
                    "references": list(sample.answers),
                    "score": score,
                    "prompt_tokens": result.prompt_tokens,
                    "kept_tokens": _mean(result.kept_tokens_per_layer),
                    "kept_tokens_per_layer": list(result.kept_tokens_per_layer),
                    "prefill_ms": result.prefill_s * 1000.0,
                    **timing,
                    "decode_ms": result.decode_s * 1000.0,
                    "new_tokens": len(result.tokens),
                    "kv_bytes_before": result.kv_bytes_before,
                    "kv_bytes_after": result.kv_bytes_after,
                    **record_fields(result),
                    "kl": kl,
                    "agreement": agreement,
                    "fields": {k: v for k, v in sample.fields.items() if k in ("length", "depth", "context_length")},
                } | first_output | group_position(context, turn))
                progress(len(rows), len(samples))
        aggregate = task.aggregate(scores, samples) if samples else {"score": None}
        aggregate |= by_context_and_turn(rows)
        return self._record(case, task, method, loaded, loaded_now, rows, aggregate,
                            meter.result, time.perf_counter() - started)

    def _single_prompts(self, case: Case, task, method, budget, loaded: LoadedModel, samples: list, sharing: bool):
        """One prompt per sample (question_in_window, query_agnostic): each sample's generation, compared
        with the full-cache reference, with its prefill split into the shared forward and its own part."""
        from kvmethods.generation import generate
        from pytest_kvbench.engine.finite_logits import check_logits_finite

        for sample in samples:
            prompt = self._prompt(case, task, sample, loaded)
            reference = self._reference(case, task, sample, prompt, loaded)
            prepared = self._prepared(case, task, sample, prompt, loaded) if sharing else None
            timing = _prefill_split(prepared, reference.result if case.method.name == FULL_METHOD and
                                    self.shared.enabled else None)
            if case.method.name == FULL_METHOD:
                yield Generation(sample, reference.result, 0.0, 1.0), timing
                continue
            result = generate(loaded.model, method, budget, prompt.input_ids, prompt.context_len,
                              task.max_new_tokens, loaded.eos_token_ids, case.protocol,
                              teacher_targets=reference.target_ids, prefilled=prepared.state if prepared else None)
            if prepared is not None:  # what this prefill costs alone: the forward + own compression
                result.prefill_s = prepared.shared_s + prepared.own_s
            prepared = None  # the cache is freed once decoded
            check_logits_finite(result.target_logprobs, f"{case.id} sample {sample.id}")
            yield Generation(sample, result, *compare(reference, result.target_logprobs)), timing

    def _follow_up(self, task, sample, output: str, method, budget, loaded: LoadedModel,
                   protocol: str = records.DEFAULT_PROTOCOL) -> str | None:
        """The answer to a task's second question about its first output (LongBench v2's CoT: the
        letter is asked for in a second, context-free query), through the same method and budget;
        None when the task asks none."""
        build = getattr(task, "follow_up_prompt", None)
        prompt = build(sample, output, loaded.tokenizer, self._max_prompt_tokens(task, loaded)) if build else None
        if prompt is None:
            return None
        from kvmethods.generation import generate

        result = generate(loaded.model, method, budget, prompt.input_ids, prompt.context_len,
                          task.follow_up_max_new_tokens, loaded.eos_token_ids, protocol)
        return loaded.tokenizer.decode(result.tokens, skip_special_tokens=True)


    def device_description(self, device: str) -> dict:
        """What the items of this worker run on (GPU name and driver, or CPU model), described once."""
        from pytest_kvbench.engine.hardware.device_description import describe_device

        if device not in self._devices:
            self._devices[device] = describe_device(device)
        return self._devices[device]

    def _record(self, case, task, method, loaded, loaded_now, rows, aggregate, meter, total_s) -> dict:
        from pytest_kvbench.engine.hardware.figures import kv_cache_figures, latency_figures

        kv = kv_cache_figures([r["kv_bytes_before"] for r in rows], [r["kv_bytes_after"] for r in rows])
        latency = latency_figures([r["prefill_ms"] / 1000.0 for r in rows], [r["decode_ms"] / 1000.0 for r in rows],
                                  [r["new_tokens"] for r in rows], total_s)
        model_info = loaded.info() | {"loaded_by_this_item": loaded_now}
        return records.identity(case, self.run_id, case.protocol) | {
            "device": self.device_description(loaded.device),
            "model": model_info,
            "method": {"name": method.name, "params": method.params()},
            "task": {"name": task.name, "suite": task.suite, "metric": task.metric_name,
                     "context_length": case.context_length},
            "max_prompt_tokens": self.grid.max_prompt_tokens,
            "metric": task.metric_name,
            "score": aggregate.get("score"),
            "aggregate": aggregate,
            "n_samples": len(rows),
            "samples": rows,
            "latency": latency,
            "memory": {"peak_bytes": meter.get("peak_bytes"), "kind": meter.get("memory_kind"),
                       "peak_method": meter.get("peak_method"),
                       "peak_reserved_bytes": meter.get("peak_reserved_bytes")} | kv,
            "fidelity": {"kl": _mean([r["kl"] for r in rows]), "agreement": _mean([r["agreement"] for r in rows])},
            "energy_j": meter.get("energy_j"),
            "energy_source": meter.get("energy_source"),
        }
