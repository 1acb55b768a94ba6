"""A serving engine's item: the case's samples through the engine, scored and compared, into a record.

The prompts are the transformers items' own token ids (engine/runner.py builds them once per worker with the
model's tokenizer), decoded greedily to the task's max_new_tokens with the model's stop tokens, and the task's
scorer scores the decoded answers, so the engine's rows pair sample by sample with every method's. Each sample's
answer is compared with the engine's own f16 cache (made on demand when the grid lacks `llamacpp:f16`, once per
worker) and with the transformers full cache (the group's reference). An engine that dies fails the item; the pool
starts a new engine for the next one.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import replace

from kvmethods.core.engine_caches import REFERENCE_TYPE, EngineCaches, engine_caches
from kvmethods.core.clock import now
from pytest_kvbench.cases import Case
from pytest_kvbench.engine.hardware.costs import kv_cache_figures, latency_figures
from pytest_kvbench.engine.runner import Runner
from pytest_kvbench.engine.time_limit import item_time_limit
from pytest_kvbench.model_sources.reference import gguf_file_of
from pytest_kvbench.results import record as records
from pytest_kvbench.results.record import mean_of_present
from pytest_kvbench.results.record.fingerprint import benchmark_of, token_digest
from pytest_kvbench.results.record.serializer import from_json
from pytest_kvbench.serving.backend import Completion, EngineDied, EngineSettings, ServingBackend
from pytest_kvbench.serving.engine_fidelity import token_agreement, top_n_kl
from pytest_kvbench.serving.engine_pool import EnginePool
from pytest_kvbench.serving.llamacpp.kv_report import agrees
from pytest_kvbench.tasks import get_task

TOP_N = 10  # log-probs the engine returns per step (its top-n KL); every engine row asks for the same


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class EngineItems:
    """Runs the serving-engine cases of a worker beside its Runner (whose model, prompts and references they share)."""

    def __init__(self, runner: Runner, make_backend: Callable[[EngineSettings], ServingBackend], threads: int = 1,
                 package: str = "xllamacpp") -> None:
        self.runner = runner
        self.pool = EnginePool(make_backend)
        self.threads = threads
        self.package = package
        self._engine_references: dict[tuple, Completion] = {}  # the engine's f16 answers, per sample

    def _answer(self, settings: EngineSettings, prompt_ids: list[int], max_new_tokens: int,
                stop_ids: list[int]) -> tuple[Completion, ServingBackend, bool]:
        engine, started = self.pool.get(settings)
        try:
            return engine.complete(prompt_ids, max_new_tokens, stop_ids, TOP_N), engine, started
        except EngineDied:
            self.pool.drop(engine)  # the next item starts a new engine
            raise

    def _engine_reference(self, key: tuple, caches: EngineCaches, settings: EngineSettings, completion: Completion,
                          prompt_ids: list[int], max_new_tokens: int, stop_ids: list[int]) -> Completion:
        """The engine's own f16 answer to the sample: this one for `llamacpp:f16`, else made once per worker."""
        if caches.is_reference:
            self._engine_references[key] = completion
        if key not in self._engine_references:
            f16 = replace(settings, cache_type_k=REFERENCE_TYPE, cache_type_v=REFERENCE_TYPE)
            self._engine_references[key] = self._answer(f16, prompt_ids, max_new_tokens, stop_ids)[0]
        return self._engine_references[key]

    def _follow_up(self, task, sample, output: str, settings: EngineSettings, loaded,
                   stop_ids: list[int]) -> tuple[dict, str]:
        """({"first_output": output} and the answer to the task's second question about it (LongBench v2's CoT),
        asked of the same engine), or ({}, output) when the task asks none."""
        build = getattr(task, "follow_up_prompt", None)
        prompt = build(sample, output, loaded.tokenizer, self.runner.max_prompt_tokens(task, loaded)) if build else None
        if prompt is None:
            return {}, output
        asked = replace(settings, context_tokens=len(prompt.input_ids) + task.follow_up_max_new_tokens + 1)
        answer = self._answer(asked, list(prompt.input_ids), task.follow_up_max_new_tokens, stop_ids)[0]
        return {"first_output": output}, loaded.tokenizer.decode(answer.tokens, skip_special_tokens=True)

    def run(self, case: Case, progress: Callable[..., None] | None = None) -> records.Record:
        progress = progress or (lambda done, total, decoded=(), samples_decoded=0: None)
        started = now()
        runner = self.runner
        task = get_task(case.task)
        caches = engine_caches(case.method.name, case.method.param_dict)
        loaded, loaded_now = runner.models.get(case.model, runner.grid.dtype, runner.grid.attn_implementation)
        model_file = str(gguf_file_of(case.model))
        samples = runner.samples_of(case, task, loaded)
        stop_ids = list(loaded.eos_token_ids or ())
        rows, scores, reports, engine_started = [], [], [], False
        limit = item_time_limit(runner.timeout_s)
        with limit:
            for sample in samples:
                prompt = runner.prompt(case, task, sample, loaded)
                prompt_ids = list(prompt.input_ids)
                settings = EngineSettings(model_file, caches.keys, caches.values,
                                          len(prompt_ids) + task.max_new_tokens + 1, self.threads)
                completion, engine, started_now = self._answer(settings, prompt_ids, task.max_new_tokens, stop_ids)
                engine_started |= started_now
                report = engine.cache_report()
                reports.append(report)
                key = (case.model, case.task, case.seed, case.context_length, sample.id)
                own = self._engine_reference(key, caches, settings, completion, prompt_ids, task.max_new_tokens,
                                             stop_ids)
                full = runner.full_cache_reference(case, task, sample, prompt, loaded, limit)
                prediction = loaded.tokenizer.decode(completion.tokens, skip_special_tokens=True)
                first_output, prediction = self._follow_up(task, sample, prediction, settings, loaded, stop_ids)
                score = float(task.score(prediction, sample))
                scores.append(score)
                kv_bytes = report.bytes_for(len(prompt_ids)) if report else None
                rows.append({
                    "id": sample.id, "prediction": prediction, "references": list(sample.answers), "score": score,
                    "prompt_tokens": completion.prompt_tokens, "kept_tokens": float(len(prompt_ids)),
                    "prefill_ms": completion.ttft_ms, "ttft_ms": completion.ttft_ms, "tpot_ms": completion.tpot_ms,
                    "decode_ms": completion.decode_ms, "new_tokens": len(completion.tokens),
                    # the benchmark's fingerprint (results/record/fingerprint.py), as the runner's rows carry it
                    "prompt_digest": token_digest(prompt_ids), "output_digest": token_digest(completion.tokens),
                    "stop": "eos" if completion.stop_token is not None else "max_new_tokens",
                    "kv_bytes_before": kv_bytes, "kv_bytes_after": kv_bytes, "engine_wall_ms": completion.wall_s * 1000,
                    "kl": None, "agreement": token_agreement(list(full.result.tokens), completion.tokens),
                    "agreement_engine": token_agreement(own.tokens, completion.tokens),
                    "top_n_kl": top_n_kl(own.tokens, own.top_logprobs, completion.tokens, completion.top_logprobs),
                    "decode_kl": None,
                    "fields": {k: v for k, v in sample.fields.items() if k in ("length", "depth", "context_length")},
                } | first_output)
                progress(len(rows), len(samples), (), 0)
        aggregate = task.aggregate(scores, samples) if samples else {"score": None}
        return self._record(case, task, caches, loaded, loaded_now, rows, aggregate, reports, engine_started,
                            now() - started)

    def _record(self, case, task, caches, loaded, loaded_now, rows, aggregate, reports, engine_started,
                total_s) -> records.Record:
        kv = kv_cache_figures([r["kv_bytes_before"] or 0 for r in rows], [r["kv_bytes_after"] or 0 for r in rows])
        latency = latency_figures([r["ttft_ms"] / 1000.0 for r in rows], [r["decode_ms"] / 1000.0 for r in rows],
                                  [r["new_tokens"] for r in rows], total_s)
        latency["decode_tokens_per_s_alone"] = latency["decode_tokens_per_s"]
        latency |= {"ttft_ms": mean_of_present(r["ttft_ms"] for r in rows),
                    "tpot_ms": mean_of_present(r["tpot_ms"] for r in rows)}
        report = next((r for r in reports if r is not None), None)
        gguf = loaded.gguf or {}
        serving = records.Serving(
            engine="llama.cpp", version=_version(self.package),
            weights=f"GGUF {gguf.get('quantization')}" if gguf else "GGUF", cache_type_k=caches.keys,
            cache_type_v=caches.values, byte_fraction=round(caches.byte_fraction, 6),
            kv_bytes_reported=report.reported_bytes if report else None,
            kv_bytes_allocated=report.allocated_bytes if report else None,
            kv_bytes_agree=agrees(report) if report else None,
            agreement_engine=mean_of_present(r["agreement_engine"] for r in rows),
            top_n_kl=mean_of_present(r["top_n_kl"] for r in rows), top_n=TOP_N, threads=self.threads,
            engine_started=engine_started)
        return replace(
            records.Record.identity(case, self.runner.run_id, case.protocol),
            device=from_json(records.Device, self.runner.device_description(loaded.device), "device"),
            model=from_json(records.ModelInfo, loaded.info() | {"loaded_by_this_item": loaded_now}, "model"),
            method=records.MethodInfo(name=caches.name, params={"k": caches.keys, "v": caches.values}),
            task=from_json(records.TaskInfo, {"name": task.name, "suite": task.suite, "metric": task.metric_name,
                                              "context_length": case.context_length} | task.record_settings(), "task"),
            max_prompt_tokens=self.runner.grid.max_prompt_tokens, metric=task.metric_name,
            benchmark=benchmark_of(task, loaded.eos_token_ids, getattr(loaded.tokenizer, "chat_template", None),
                                   self.runner.device_description(loaded.device)),
            score=aggregate.get("score"), aggregate=aggregate, n_samples=len(rows), samples=rows,
            latency=from_json(records.Latency, latency, "latency"),
            memory=records.Memory(kind="engine cache (not metered: the engine runs in its own process)", **kv),
            fidelity=records.Fidelity(agreement=mean_of_present(r["agreement"] for r in rows)),
            serving=serving,
        )
