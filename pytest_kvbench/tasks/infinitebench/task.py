"""An InfiniteBench task: official records -> the open-model prompt -> the official scorer.

The protocol of src/eval_yarn_mistral.py: the filled template is cut in the middle to the
model's length (the official script cuts at 128K tokens, ``tokens[:n//2] + tokens[-n//2:]`` of
``tok.encode`` with the BOS, decoded without special tokens), no chat template, greedy decoding.
The ground truth is what src/eval_utils.get_answer stores, and a record without what its scorer
needs (options for the choice tasks, a function call for code_run, a numeric answer for the
math tasks, ...) is a DataError naming file and line: it would crash the official scorer or
silently score 0.
"""

from __future__ import annotations

import re

from ..base import Sample
from ..errors import DataError
from ..prompting import TemplateTask
from ..sources import SuiteData, require_fields, sample_id
from .scoring import SCORERS

DATA = SuiteData(
    "infinitebench",
    "download {file} from https://huggingface.co/datasets/xinrongzhang2022/InfiniteBench and pass "
    "--kvbench-data <its folder> (or load it once online through datasets); "
    "--kvbench-data fixtures runs the packaged samples",
)
HUB_REPO = "xinrongzhang2022/InfiniteBench"
LETTERS = "ABCD"
CHOICE_TASKS = ("longbook_choice_eng", "code_debug")
_FUNCTION_CALL = re.compile(r"func_[0-9]+\(\-?[0-9]+\)")
_TARGET_NUMBER = re.compile(r"The .+ of")


def _answers_list(record: dict, where: str) -> list:
    answer = record["answer"]
    answers = answer if isinstance(answer, list) else [answer]
    if not answers:
        raise DataError(f"{where}: field 'answer' is empty")
    return answers


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise DataError(f"{where}: {message}")


def official_label(task: str, record: dict, where: str):
    """eval_utils.get_answer, with each scorer's needs checked."""
    answers = _answers_list(record, where)
    first = answers[0]
    if task in CHOICE_TASKS:
        options = record.get("options")
        _require(isinstance(options, list) and len(options) == 4 and all(isinstance(o, str) for o in options),
                 where, "field 'options' must be a list of 4 strings")
        if len(answers) == 2 and answers[1] in tuple(LETTERS):
            return list(answers)
        _require(len(answers) == 1 and first in options, where, f"field 'answer' must name one of the options, got {first!r}")
        return [first, LETTERS[options.index(first)]]
    if task in ("passkey", "number_string"):
        _require(isinstance(first, str) and first.isdigit(), where, f"field 'answer' must be a string of digits, got {first!r}")
    elif task == "code_run":
        _require(isinstance(first, int) and not isinstance(first, bool), where, f"field 'answer' must be an integer, got {first!r}")
        _require(bool(_FUNCTION_CALL.search(record["input"])), where, "field 'input' has no call like func_1(-3)")
    elif task == "math_find":
        _require(isinstance(first, (int, float)) and not isinstance(first, bool), where,
                 f"field 'answer' must be a number, got {first!r}")
        _require(bool(_TARGET_NUMBER.search(record["input"])), where, "field 'input' does not ask for 'The ... of' the list")
    elif task == "math_calc":
        values = first if isinstance(first, list) else answers
        _require(bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values), where,
                 "field 'answer' must be a non-empty list of integers")
    else:
        _require(all(isinstance(a, str) and a for a in answers), where, "field 'answer' must hold non-empty strings")
    return record["answer"] if task in ("math_calc",) else answers


class InfiniteBenchTask(TemplateTask):
    suite = "infinitebench"
    use_chat_template = False  # the open-model scripts feed the plain template


    def _validate(self, record, where: str) -> dict:
        require_fields(record, where, {"context": str, "input": str, "answer": (list, str, int, float)})
        record["label"] = official_label(self.spec.name, record, where)
        return record

    def load_samples(self, tokenizer=None, n: int | None = None, seed: int = 0, data_dir=None,
                     context_length: int | None = None) -> list[Sample]:
        """The first ``n`` records in file order (``seed`` and ``context_length`` do not apply)."""
        hub = {"path": HUB_REPO, "data_files": self.spec.data_file, "split": "train"}
        samples = []
        for source, record in DATA.records(self.spec.data_file, self._validate, data_dir, n, hub=hub):
            answers = [str(a) for a in (record["label"] if isinstance(record["label"], list) else [record["label"]])]
            own_id = sample_id(record, self.spec.name, source, key="id")
            samples.append(Sample(id=own_id if ":" in own_id else f"{self.spec.name}:{own_id}", answers=answers,
                                  fields=dict(record, source=source)))
        return samples

    def template_values(self, sample: Sample) -> dict:
        """eval_utils.create_prompt's values for the task's template."""
        record = sample.fields
        values = {"context": record["context"], "input": record["input"], "question": record["input"]}
        if self.spec.name in CHOICE_TASKS:
            values.update({f"OPTION_{letter}": option for letter, option in zip(LETTERS, record["options"])})
        if self.spec.name == "code_run":
            call = _FUNCTION_CALL.findall(record["input"])[0]
            values.update(func_call=call, func=call.split("(")[0])
        if self.spec.name == "math_find":
            target = _TARGET_NUMBER.findall(record["input"])[0].lower()[:-3]
            values["prefix"] = f"What is {target} in the following list?"
        return values

    def score(self, prediction: str, sample: Sample) -> float:
        return float(SCORERS[self.spec.name](prediction or "", sample.fields["label"]))
