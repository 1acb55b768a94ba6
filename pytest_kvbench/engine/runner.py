"""One benchmark item's work: samples -> prompts -> compressed generation -> scores -> a record.

Everything expensive that does not depend on the method is shared between items through caches
that live for the whole worker process: the model (models.py), the task's samples and tokenized
prompts, the full-cache reference pass used for fidelity (fidelity.py), and the prefill itself:
one forward per sample gives the reference's cache and the compressed cache of every planned item
of the reference group (the runner's GroupPrefiller, sample_prefills.py: of the next samples too when batching
across samples), each decoded right away (group_decode.py); an item then takes its samples' outcomes
(sample_outcomes.py) and scores them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kvmethods.core.clock import now
from kvmethods.runtime.generation import GROUP_PROTOCOLS, generate, record_fields
from pytest_kvbench.cases import DEFAULT_PROTOCOL, Case, Grid
from pytest_kvbench.engine.case_methods import method_of, takes_shared_prefill
from pytest_kvbench.engine.fidelity import ReferenceCache
from pytest_kvbench.engine.decode_batching import DecodeBatching
from pytest_kvbench.engine.sample_decoding import decode_compressed, decode_reference, reference_key
from pytest_kvbench.engine.sample_inputs import SampleInputs
from pytest_kvbench.engine.sample_prefills import GroupPrefiller
from pytest_kvbench.engine.hardware.device_description import describe_device
from pytest_kvbench.engine.hardware.costs import kv_cache_figures, latency_figures
from pytest_kvbench.engine.hardware.item_meter import ItemMeter
from pytest_kvbench.engine.models import LoadedModel, ModelCache
from pytest_kvbench.engine.out_of_memory import fail_on_out_of_memory
from pytest_kvbench.engine.protocol_runs import Generation, by_context_and_turn, generations, group_position
from pytest_kvbench.engine.sample_outcomes import SharedPrefills
from pytest_kvbench.engine.time_limit import item_time_limit
from pytest_kvbench.results import record as records
from pytest_kvbench.results.record import mean_of_present
from pytest_kvbench.results.record.fingerprint import benchmark_of, token_digest
from pytest_kvbench.results.record.serializer import from_json
from pytest_kvbench.tasks import get_task


def _token_layers_kept(result) -> list[int]:
    """Kept tokens of the layers holding per-token keys and values: a linear-attention layer (no head holds a token,
    kept_tokens_per_head []) keeps a fixed state, so it does not pull the mean down."""
    per_head = result.kept_tokens_per_head
    if len(per_head) != len(result.kept_tokens_per_layer):
        return list(result.kept_tokens_per_layer)
    return [kept for kept, heads in zip(result.kept_tokens_per_layer, per_head) if heads]


def _prefill_split(shared_reference=None) -> dict:
    """The labelled parts of the reference's prefill_ms when it came from a shared prefill (else None):
    the shared forward, spent once per sample for the whole reference group, and no compression.
    (A compressed item's split comes with its outcome: group_decode.py.)"""
    if shared_reference is not None:
        return {"shared_prefill_ms": shared_reference.prefill_s * 1000.0, "compression_ms": 0.0}
    return {"shared_prefill_ms": None, "compression_ms": None}


class Runner:
    """Runs cases; one instance per worker process (held by the session)."""

    def __init__(self, grid: Grid, run_id: str, timeout_s: float | None = None, share_prefill: bool = True,
                 decode_batch: int | str = 1) -> None:
        self.grid = grid
        self.shared = SharedPrefills(share_prefill, grid.measure_alone)
        self.batching = DecodeBatching(decode_batch)  # --kvbench-decode-batch: members per decoding batch
        self.run_id = run_id
        self.timeout_s = timeout_s
        self.models = ModelCache()
        self.references = ReferenceCache()
        self.inputs = SampleInputs(grid)  # the cases' samples and prompts, made once
        # the group's shared prefills: it fills `references` and the members' outcomes in `shared`
        self.prefills = GroupPrefiller(self.shared, self.batching, self.references, self.inputs)
        self._devices: dict[str, dict] = {}

    # -- shared inputs -------------------------------------------------------------------------
    def samples_of(self, case: Case, task, loaded: LoadedModel) -> list:
        """The case's samples, loaded once per worker (a serving engine's items read the same: serving/)."""
        return self.inputs.samples(case, task, loaded)

    def full_cache_reference(self, case: Case, task, sample, prompt, loaded: LoadedModel, limit: item_time_limit):
        """The sample's full-cache reference (a Reference: its generation and distributions), made once per worker
        and shared with its group's items; a serving engine's item compares its answer with it."""
        return self._reference(case, task, sample, prompt, loaded, limit)

    def max_prompt_tokens(self, task, loaded: LoadedModel) -> int | None:
        """The longest prompt the task may build for this model (SampleInputs.max_prompt_tokens)."""
        return self.inputs.max_prompt_tokens(task, loaded)

    def prompt(self, case: Case, task, sample, loaded: LoadedModel):
        """The sample's prompt, built once per worker (every method and budget of the case's group reads it)."""
        return self.inputs.prompt(case, task, sample, loaded)

    def _reference(self, case: Case, task, sample, prompt, loaded: LoadedModel, limit: item_time_limit):
        """The full-cache pass of a sample, computed once per run and shared by every method; with sharing, made
        by the group's shared prefill with its members' outcomes (GroupPrefiller.reference)."""
        if not self.shared.enabled:
            return self.references.get(reference_key(case, sample),
                                       lambda: decode_reference(case, task, sample, prompt, loaded))
        return self.prefills.reference(case, task, sample, prompt, loaded, limit, self._time_left)

    # -- the item ------------------------------------------------------------------------------
    def run(self, case: Case, progress: Callable[..., None] | None = None) -> records.Record:
        """The item's record; out of memory raises ItemOutOfMemory after the memory is freed.
        progress(samples done, samples in all, decoded, samples_decoded) is called after each sample; decoded: the
        `decode_batch` of each (member, sample) this run decoded for the group since the last call, samples_decoded:
        how many samples those were (sample_outcomes.py)."""
        try:
            with fail_on_out_of_memory(case.id):
                return self._run(case, progress or (lambda done, total, decoded=(), samples_decoded=0: None))
        finally:
            self.shared.finish(case)  # outcomes left for this item (it failed mid-way) are freed

    def _run(self, case: Case, progress: Callable[..., None]) -> records.Record:
        started = now()
        task = get_task(case.task)
        method = method_of(case)
        sharing = self.shared.enabled and takes_shared_prefill(case)
        loaded, loaded_now = self.models.get(case.model, self.grid.dtype, self.grid.attn_implementation)
        samples = self.inputs.samples(case, task, loaded)
        rows: list[dict] = []
        scores: list[float] = []
        limit = item_time_limit(self._time_left(case))
        with limit, ItemMeter(loaded.device) as meter:
            if case.protocol in GROUP_PROTOCOLS:  # several questions on one compressed context: no shared prefill
                prompts = [self.prompt(case, task, sample, loaded) for sample in samples]
                produced = ((made, {}) for made in generations(case, task, method, case.budget, loaded, samples, prompts,
                                                               self.references))
            else:
                produced = self._single_prompts(case, task, method, case.budget, loaded, samples, sharing, limit)
            for (sample, result, kl, agreement, context, turn, decode_kl), timing in produced:
                prediction = loaded.tokenizer.decode(result.tokens, skip_special_tokens=True)
                answer = self._follow_up(task, sample, prediction, method, case.budget, loaded, case.protocol)
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
                    "kept_tokens": mean_of_present(_token_layers_kept(result)),
                    "kept_tokens_per_layer": list(result.kept_tokens_per_layer),
                    "prefill_ms": result.prefill_s * 1000.0,
                    **timing,
                    "decode_ms": result.decode_s * 1000.0,
                    "new_tokens": len(result.tokens),
                    # the benchmark's fingerprint (results/record/fingerprint.py): what was asked, what came out
                    "prompt_digest": token_digest(self.prompt(case, task, sample, loaded).input_ids),
                    "output_digest": token_digest(result.tokens),
                    # why the decode ended: the model's eos, or the task's max_new_tokens (tests check the two)
                    "stop": "eos" if result.stop_token is not None else "max_new_tokens",
                    "kv_bytes_before": result.kv_bytes_before,
                    "kv_bytes_after": result.kv_bytes_after,
                    **record_fields(result),
                    "kl": kl,
                    "agreement": agreement,
                    "decode_kl": decode_kl,
                    # all_classes: LongBench's label set, which its classification metric reads (exports)
                    "fields": {k: v for k, v in sample.fields.items()
                               if k in ("length", "depth", "context_length") or (k == "all_classes" and v)},
                } | first_output | group_position(context, turn))
                progress(len(rows), len(samples), self.shared.decoded_batches(case), self.shared.decoded_samples(case))
        aggregate = task.aggregate(scores, samples) if samples else {"score": None}
        aggregate = by_context_and_turn(rows) | aggregate  # a task's own "turns" (SCBench's) win
        return self._record(case, task, method, loaded, loaded_now, rows, aggregate,
                            meter.result, now() - started)

    def _time_left(self, case: Case) -> float | None:
        """The item's time limit less its decoding already done in other items' runs (group_decode.py);
        None: no limit."""
        if not self.timeout_s:
            return self.timeout_s
        return max(self.timeout_s - self.shared.spent(case), 1e-3)

    def _single_prompts(self, case: Case, task, method, budget, loaded: LoadedModel, samples: list, sharing: bool,
                        limit: item_time_limit):
        """One prompt per sample (question_in_window, query_agnostic): each sample's generation, compared
        with the full-cache reference, with its prefill split into the shared forward and its own part."""
        for sample in samples:
            prompt = self.prompt(case, task, sample, loaded)
            reference = self._reference(case, task, sample, prompt, loaded, limit)
            if case.is_reference:
                yield Generation(sample, reference.result, 0.0, 1.0, decode_kl=0.0), _prefill_split(
                    reference.result if self.shared.enabled else None)
            elif sharing:  # decoded with the group's shared prefill of the sample (maybe in another item's run)
                decoded = self.shared.take(case, sample.id)
                yield Generation(sample, decoded.result, decoded.kl, decoded.agreement,
                                 decode_kl=decoded.decode_kl), decoded.timing
            else:
                result, kl, agreement, decode_kl = decode_compressed(case, method, budget, task, sample, prompt, loaded,
                                                                     reference)
                yield Generation(sample, result, kl, agreement, decode_kl=decode_kl), _prefill_split()

    def _follow_up(self, task, sample, output: str, method, budget, loaded: LoadedModel,
                   protocol: str = DEFAULT_PROTOCOL) -> str | None:
        """The answer to a task's second question about its first output (LongBench v2's CoT: the
        letter is asked for in a second, context-free query), through the same method and budget;
        None when the task asks none."""
        build = getattr(task, "follow_up_prompt", None)
        prompt = build(sample, output, loaded.tokenizer, self.max_prompt_tokens(task, loaded)) if build else None
        if prompt is None:
            return None
        result = generate(loaded.model, method, budget, prompt.input_ids, prompt.context_len,
                          task.follow_up_max_new_tokens, loaded.eos_token_ids, protocol)
        return loaded.tokenizer.decode(result.tokens, skip_special_tokens=True)

    def device_description(self, device: str) -> dict:
        """What the items of this worker run on (GPU name and driver, or CPU model), described once."""
        if device not in self._devices:
            self._devices[device] = describe_device(device)
        return self._devices[device]

    def _record(self, case, task, method, loaded, loaded_now, rows, aggregate, meter, total_s) -> records.Record:
        kv = kv_cache_figures([r["kv_bytes_before"] for r in rows], [r["kv_bytes_after"] for r in rows])
        latency = latency_figures([r["prefill_ms"] / 1000.0 for r in rows], [r["decode_ms"] / 1000.0 for r in rows],
                                  [r["new_tokens"] for r in rows], total_s)
        alone = [r for r in rows if r.get("decode_batch", 1) == 1]  # samples decoded alone: the method's own speed
        latency["decode_tokens_per_s_alone"] = latency_figures(
            [], [r["decode_ms"] / 1000.0 for r in alone], [r["new_tokens"] for r in alone])["decode_tokens_per_s"]
        latency["decode_batch_note"] = self.batching.shrunk
        return replace(
            records.Record.identity(case, self.run_id, case.protocol),
            device=from_json(records.Device, self.device_description(loaded.device), "device"),
            model=from_json(records.ModelInfo, loaded.info() | {"loaded_by_this_item": loaded_now}, "model"),
            method=records.MethodInfo(name=method.name, params=method.params()),
            task=from_json(records.TaskInfo, {"name": task.name, "suite": task.suite, "metric": task.metric_name,
                                              "context_length": case.context_length} | task.record_settings(), "task"),
            max_prompt_tokens=self.grid.max_prompt_tokens,
            metric=task.metric_name,
            benchmark=benchmark_of(task, loaded.eos_token_ids, getattr(loaded.tokenizer, "chat_template", None),
                                   self.device_description(loaded.device)),
            score=aggregate.get("score"),
            aggregate=aggregate,
            n_samples=len(rows),
            samples=rows,
            latency=from_json(records.Latency, latency, "latency"),
            memory=records.Memory(peak_bytes=meter.get("peak_bytes"), kind=meter.get("memory_kind"),
                                  peak_method=meter.get("peak_method"),
                                  peak_reserved_bytes=meter.get("peak_reserved_bytes"), **kv),
            fidelity=records.Fidelity(kl=mean_of_present(r["kl"] for r in rows),
                                      agreement=mean_of_present(r["agreement"] for r in rows),
                                      decode_kl=mean_of_present(r["decode_kl"] for r in rows)),
            energy_j=meter.get("energy_j"),
            energy_source=meter.get("energy_source"),
            meter_scope=from_json(records.MeterScope, self.shared.meter_scope(case), "meter_scope"),
        )
