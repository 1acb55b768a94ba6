"""A LongBench task: records -> samples -> prompts -> official scores."""

from __future__ import annotations

from ..base import Sample, percent_mean
from ..metrics import METRICS, best_over_references, first_line
from ..prompting import TemplateTask
from .config import LENGTH_BUCKETS
from .data import load_records


class LongBenchTask(TemplateTask):
    suite = "longbench"

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

    def template(self) -> str:
        return self.spec.prompt

    @property
    def use_chat_template(self) -> bool:
        return self.spec.use_chat_template

    def score(self, prediction: str, sample: Sample) -> float:
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

