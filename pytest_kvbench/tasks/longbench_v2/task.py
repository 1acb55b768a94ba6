"""LongBench v2 tasks: ``longbench_v2`` (answer directly) and ``longbench_v2_cot`` (think first).

The protocol of pred.py and result.py in THUDM/LongBench (v2): the chat template always applies
(the official script queries a chat endpoint), an over-long prompt is cut in the middle to the
model's maximum, generation is 128 tokens (1,024 for the chain of thought), the answer letter is
extracted from the response and compared with the record's letter. result.py reports accuracy
overall, by difficulty (easy/hard) and by length (short/medium/long), in percent rounded to 1
decimal; ``aggregate`` returns those splits.

Where this harness departs from the official script, on purpose:

* pred.py drops a sample whose response is exactly ``''`` (``if output == '': continue``: its
  API client returns ``''`` when every try failed, and the next run asks again); here every sample
  counts: an empty answer has no letter and scores 0, and an empty reasoning gets the second
  query like a whitespace-only one (below).

The CoT run is pred.py's two queries: the reasoning (``ZERO_SHOT_COT``, 1,024 tokens), then, via
``follow_up_prompt``, a second query without the context that pastes the stripped reasoning into
``ZERO_SHOT_COT_ANSWER`` and asks for "The correct answer is (X)" (128 tokens); the letter is
extracted from that second response. The second query is sent whatever the reasoning holds: a
whitespace-only reasoning is not ``''``, so pred.py strips it and asks with an empty ``$COT$``, and
an empty one is asked the same way here (pred.py would drop it). The runner sends both queries
through the same method and budget and records the reasoning as the sample's ``first_output``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base import Prompt, Sample, Task, percent_mean
from ..errors import DataError
from ..prompting import build_truncated_prompt
from ..sources import SuiteData, read_json_array, require_fields
from .prompts import CHOICE_KEYS, ZERO_SHOT, ZERO_SHOT_COT, ZERO_SHOT_COT_ANSWER, extract_answer, fill

HUB = {"path": "THUDM/LongBench-v2", "split": "train"}
DATA = SuiteData(
    "longbench_v2",
    "get data.json from https://huggingface.co/datasets/THUDM/LongBench-v2 and pass --kvbench-data <its folder> "
    "(or load it once online with datasets: load_dataset('THUDM/LongBench-v2', split='train')); "
    "--kvbench-data fixtures runs the packaged samples",
    reader=read_json_array,
)
DATA_FILE = "data.json"
DIFFICULTIES = ("easy", "hard")
LENGTHS = ("short", "medium", "long")
LETTERS = ("A", "B", "C", "D")
_TEXT_FIELDS = ("_id", "domain", "sub_domain", "question", *CHOICE_KEYS, "context")


@dataclass(frozen=True)
class LongBenchV2Spec:
    name: str
    template: str
    max_new_tokens: int  # pred.py: 128, or 1,024 for the reasoning pass
    metric_name: str = "accuracy"
    cot: bool = False


def longbench_v2_specs() -> dict[str, LongBenchV2Spec]:
    return {
        "longbench_v2": LongBenchV2Spec("longbench_v2", ZERO_SHOT, 128),
        "longbench_v2_cot": LongBenchV2Spec("longbench_v2_cot", ZERO_SHOT_COT, 1024, cot=True),
    }


def validate_record(record, where: str) -> dict:
    require_fields(record, where, {name: str for name in _TEXT_FIELDS + ("difficulty", "length", "answer")})
    for name, allowed in (("difficulty", DIFFICULTIES), ("length", LENGTHS), ("answer", LETTERS)):
        if record[name] not in allowed:
            raise DataError(f"{where}: field {name!r} must be one of {', '.join(allowed)}, got {record[name]!r}")
    return record


class LongBenchV2Task(Task):
    suite = "longbench_v2"
    follow_up_max_new_tokens = 128  # pred.py's answer-extraction query after the reasoning

    def load_samples(self, tokenizer=None, n: int | None = None, seed: int = 0, data_dir=None,
                     context_length: int | None = None) -> list[Sample]:
        """The first ``n`` questions in file order (``seed`` and ``context_length`` do not apply)."""
        samples = []
        for source, record in DATA.records(DATA_FILE, validate_record, data_dir, n, hub=HUB):
            fields = dict(record, source=source, length_class=record["length"])
            fields.pop("length")  # the record field "length" is a class name, not a token count
            samples.append(Sample(id=record["_id"], answers=[record["answer"]], fields=fields))
        return samples

    def prompt_text(self, sample: Sample) -> str:
        return fill(self.spec.template, sample.fields)

    def question_text(self, sample: Sample) -> str:
        return fill(self.spec.template.split("$DOC$", 1)[1], sample.fields)

    def build_prompt(self, sample: Sample, tokenizer, max_prompt_tokens: int | None) -> Prompt:
        return build_truncated_prompt(tokenizer, self.prompt_text(sample), self.question_text(sample),
                                      max_prompt_tokens, use_chat=True, odd_token_to_tail=True)

    def follow_up_prompt(self, sample: Sample, first_output: str, tokenizer, max_prompt_tokens: int | None):
        """The CoT run's second query (None without CoT), also for an empty or whitespace-only
        reasoning: pred.py pastes ``output.strip()`` in, whatever it holds."""
        if not self.spec.cot:
            return None
        text = fill(ZERO_SHOT_COT_ANSWER, sample.fields, cot=first_output.strip())
        question = text[text.rindex("\n\nBased on the above"):]
        return build_truncated_prompt(tokenizer, text, question, max_prompt_tokens, use_chat=True,
                                      odd_token_to_tail=True)

    def score(self, prediction: str, sample: Sample) -> float:
        return float(extract_answer((prediction or "").strip()) == sample.answers[0])

    def aggregate(self, scores: list[float], samples: list[Sample]) -> dict:
        return {"score": percent_mean(list(scores)), "splits": splits(scores, samples)}


def splits(scores: list[float], samples: list[Sample]) -> dict[str, float | None]:
    """result.py's table row: Overall, Easy, Hard, Short, Medium, Long, each 100 x accuracy
    rounded to 1 decimal (None for a group with no sample, where result.py divides by zero)."""
    groups: dict[str, list[float]] = {"overall": list(scores)}
    for name in DIFFICULTIES + LENGTHS:
        groups[name] = []
    for value, sample in zip(scores, samples):
        groups[sample.fields["difficulty"]].append(value)
        groups[sample.fields["length_class"]].append(value)
    return {name: round(100 * sum(values) / len(values), 1) if values else None for name, values in groups.items()}
