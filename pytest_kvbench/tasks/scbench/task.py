"""An SCBench task: one sample per turn of a shared-context conversation, scored per turn.

SCBench (Li et al. 2024, arXiv 2412.10319; microsoft/MInference scbench/, commit fb56c91) asks up to
``MAX_TURNS`` questions about one long context as a conversation. Its official run (run_scbench.py,
multi-turn mode) feeds every turn the *gold* answers of the turns before it by default
(``--disable_golden_context`` feeds the model's own instead), and compute_scores.py reports the
accuracy of each turn. Here each turn is a sample (``context_id`` and ``turn`` in its fields) whose
prompt is the conversation up to its question (conversation.py: the first turn chat-templated, then
truncated as the official code does; later turns appended), so:

* every protocol sees what SCBench's turn k sees; query_agnostic and multi_turn compress the context
  once and keep the history and question uncompressed, as SCBench's shared context is compressed once
  and reused; multi_turn runs the turns in one cache and drops each answer once decoded;
* ``<task>:history=model`` is the ``--disable_golden_context`` run: under multi_turn only (a model's own
  answers exist only in a conversation), each turn is its follow-up on top of the model's answers;
* ``aggregate`` reports the score of each turn ("turns", from 1) and the pooled score of all turns
  ("score"); the record names the history (``task.history``).
"""

from __future__ import annotations

from ..base import Prompt, Sample, percent_mean
from ..errors import DataError
from ..prompting import TemplateTask
from ..sources import SuiteData, require_fields, sample_id
from .conversation import turn_prompt, turn_values
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

    @property
    def turn_history(self) -> str:
        return self.spec.history

    @property
    def only_in_conversation(self) -> bool:
        return self.spec.history == "model"

    def record_settings(self) -> dict:
        return {"history": self.spec.history}

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
            turns = [{"input": t["input"], "answer": t["answer"], "options": t.get("options")}
                     for t in record["multi_turns"][:MAX_TURNS]]
            for turn_index, turn in enumerate(record["multi_turns"][:MAX_TURNS]):
                if n is not None and len(samples) >= n:
                    return samples
                label = turn["label"]
                samples.append(Sample(
                    id=f"{self.spec.name}:{context_id}:{turn_index}",
                    answers=list(label) if isinstance(label, list) else [label],
                    fields={"context": record["context"], "input": turn["input"], "label": label,
                            "options": turn.get("options"), "context_id": context_id, "turn": turn_index,
                            "turns": turns, "source": source},
                ))
        return samples

    def template_values(self, sample: Sample) -> dict:
        return turn_values(sample.fields, sample.fields["context"])

    def build_prompt(self, sample: Sample, tokenizer, max_prompt_tokens: int | None) -> Prompt:
        """The conversation up to the sample's turn; the first turn keeps room for every turn's answer."""
        turns = sample.fields["turns"]
        limit = None if max_prompt_tokens is None else max_prompt_tokens - (len(turns) - 1) * self.max_new_tokens
        return turn_prompt(self.spec, sample.fields["context"], turns, sample.fields["turn"], tokenizer, limit,
                           self.use_chat_template)

    def score(self, prediction: str, sample: Sample) -> float:
        return float(SCORERS[self.spec.metric_name](prediction or "", sample.fields["label"]))

    def aggregate(self, scores: list[float], samples: list[Sample]) -> dict:
        """compute_scores.py's accuracy of each turn ("turns": {"1": ..}, 100 x mean to 3 decimals, as its
        summary line prints them) and, not in the official output, the pooled score of every turn ("score")."""
        by_turn: dict[int, list[float]] = {}
        for score, sample in zip(scores, samples):
            by_turn.setdefault(sample.fields["turn"] + 1, []).append(score)
        return {"score": percent_mean(list(scores)),
                "turns": {str(turn): round(100 * sum(values) / len(values), 3)
                          for turn, values in sorted(by_turn.items())}}
