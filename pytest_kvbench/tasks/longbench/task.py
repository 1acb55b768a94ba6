"""A LongBench task: records -> samples -> prompts -> official scores."""

from __future__ import annotations

from ..base import Prompt, Sample, Task, percent_mean
from ..prompting import build_truncated_prompt
from .config import LENGTH_BUCKETS, LongBenchSpec
from .data import load_records


class LongBenchTask(Task):
    suite = "longbench"

    def __init__(self, spec: LongBenchSpec):
        self.spec = spec
        self.name = spec.name
        self.metric_name = spec.metric_name
        self.max_new_tokens = spec.max_new_tokens

    def load_samples(self, tokenizer=None, n: int | None = None, seed: int = 0, data_dir=None,
                     context_length: int | None = None) -> list[Sample]:
        """The first ``n`` records in file order (``seed`` and ``context_length`` do not apply)."""
        samples = []
        for source, record in load_records(self.spec.name, data_dir, n):
            fields = dict(record)
            fields["all_classes"] = record.get("all_classes") or []
            fields["source"] = source
            sample_id = str(record.get("_id") or f"{self.spec.name}:{source.rsplit(':', 1)[-1]}")
            samples.append(Sample(id=sample_id, answers=list(record["answers"]), fields=fields))
        return samples

    def prompt_text(self, sample: Sample) -> str:
        """The official template filled with the record (before truncation and chat template)."""
        return self.spec.prompt.format(**_template_values(sample))

    def question_text(self, sample: Sample) -> str:
        """The part of the filled template after the context."""
        after_context = self.spec.prompt.split("{context}", 1)[1]
        return after_context.format(**_template_values(sample))

    def build_prompt(self, sample: Sample, tokenizer, max_prompt_tokens: int | None) -> Prompt:
        return build_truncated_prompt(tokenizer, self.prompt_text(sample), self.question_text(sample),
                                      max_prompt_tokens, use_chat=self.spec.use_chat_template)

    def score(self, prediction: str, sample: Sample) -> float:
        from ..metrics import METRICS, best_over_references, first_line

        prediction = prediction or ""
        if self.spec.first_line_only:
            prediction = first_line(prediction)
        return best_over_references(
            METRICS[self.metric_name], prediction, sample.answers, all_classes=sample.fields.get("all_classes")
        )

    def aggregate(self, scores: list[float], samples: list[Sample]) -> dict:
        result = {"score": percent_mean(list(scores))}
        if self.spec.length_buckets:
            buckets: dict[str, list[float]] = {label: [] for _, label in LENGTH_BUCKETS}
            for value, sample in zip(scores, samples):
                buckets[length_bucket(int(sample.fields["length"]))].append(value)
            result["buckets"] = {label: percent_mean(values) for label, values in buckets.items()}
        return result


def length_bucket(length: int) -> str:
    label = LENGTH_BUCKETS[0][1]
    for lower, name in LENGTH_BUCKETS:
        if length >= lower:
            label = name
    return label


def _template_values(sample: Sample) -> dict:
    return {"context": sample.fields["context"], "input": sample.fields["input"]}
