"""An SCBench task on the question_in_window protocol: one sample per (context, question).

SCBench shares one long context across several questions (multi-turn: each turn after the
previous answers; multi-request: each question alone on the cached context). Until the harness
has those protocols (issue #17), each of a context's first ``MAX_TURNS`` questions is its own
sample: the first turn's template filled with that question, middle-truncated to the model,
under the chat template. Samples keep ``context_id`` and ``turn`` in their fields, so a
shared-context protocol can group a context's questions again (and compress the context once).
"""

from __future__ import annotations

from ..base import Sample
from ..errors import DataError
from ..prompting import TemplateTask
from ..sources import SuiteData, require_fields, sample_id
from .scoring import SCORERS
from .specs import MAX_TURNS

DATA = SuiteData(
    "scbench",
    "download data/{file} from https://huggingface.co/datasets/microsoft/SCBench and pass --kvbench-data "
    "<its folder> (or load it once online through datasets); --kvbench-data fixtures runs the packaged samples",
)
HUB_REPO = "microsoft/SCBench"


class SCBenchTask(TemplateTask):
    suite = "scbench"
    has_turns = True

    def _validate(self, record, where: str) -> dict:
        require_fields(record, where, {"context": str, "multi_turns": list})
        if not record["multi_turns"]:
            raise DataError(f"{where}: field 'multi_turns' is empty")
        for index, turn in enumerate(record["multi_turns"][:MAX_TURNS]):
            require_fields(turn, f"{where}: multi_turns[{index}]", {"input": str})
            turn["label"] = self._label(turn, f"{where}: multi_turns[{index}]")
        return record

    def _label(self, turn: dict, where: str):
        """get_ground_truth's label, checked: vt needs a list of strings, the others one string,
        choice_eng one of the turn's 4 options (the label is then the option and its letter)."""
        answer = turn.get("answer")
        if self.spec.metric_name == "choice":
            options = turn.get("options")
            if not (isinstance(options, list) and len(options) == 4 and all(isinstance(o, str) for o in options)):
                raise DataError(f"{where}: field 'options' must be a list of 4 strings")
            if answer not in options:
                raise DataError(f"{where}: field 'answer' must be one of the options, got {answer!r}")
            return [answer, "ABCD"[options.index(answer)]]
        if self.spec.metric_name == "string_match_all":
            if not (isinstance(answer, list) and answer and all(isinstance(a, str) and a for a in answer)):
                raise DataError(f"{where}: field 'answer' must be a non-empty list of strings, got {answer!r}")
            return answer
        if not (isinstance(answer, str) and answer):
            raise DataError(f"{where}: field 'answer' must be a non-empty string, got {answer!r}")
        return [answer] if self.spec.metric_name == "any_reference_in_prediction" else answer

    def load_samples(self, tokenizer=None, n: int | None = None, seed: int = 0, data_dir=None,
                     context_length: int | None = None) -> list[Sample]:
        """The first ``n`` questions, context by context in file order, turn by turn."""
        hub = {"path": HUB_REPO, "name": self.spec.name, "split": "test"}
        samples: list[Sample] = []
        for source, record in DATA.records(self.spec.data_file, self._validate, data_dir, n, hub=hub):
            context_id = sample_id(record, self.spec.name, source, key="id")
            for turn_index, turn in enumerate(record["multi_turns"][:MAX_TURNS]):
                if n is not None and len(samples) >= n:
                    return samples
                label = turn["label"]
                samples.append(Sample(
                    id=f"{self.spec.name}:{context_id}:{turn_index}",
                    answers=list(label) if isinstance(label, list) else [label],
                    fields={"context": record["context"], "input": turn["input"], "label": label,
                            "options": turn.get("options"), "context_id": context_id, "turn": turn_index,
                            "source": source},
                ))
        return samples

    def template_values(self, sample: Sample) -> dict:
        values = super().template_values(sample)
        for letter, option in zip("ABCD", sample.fields.get("options") or ()):
            values[f"OPTION_{letter}"] = option
        return values

    def score(self, prediction: str, sample: Sample) -> float:
        return float(SCORERS[self.spec.metric_name](prediction or "", sample.fields["label"]))
