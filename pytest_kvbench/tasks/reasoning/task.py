r"""A reasoning task: a competition problem, a long chain of thought, the boxed answer verified.

Nothing is truncated (a problem is a few hundred tokens); the chat template applies. In the
query-agnostic protocol the problem is the context and the instruction the question. A record
whose reference answer math-verify cannot parse is a DataError at loading, so a sample never
scores 0 for want of a usable reference.

Scoring, each step with the reference it follows (answer_extraction.py, verification.py):

1. The reasoning block goes first: the answer is the text after the last ``</think>``, whether the
   output opened ``<think>`` itself or the chat template opened it (DeepSeek-R1-Distill, Qwen3), so a
   ``\boxed{}`` tried and dropped while thinking never counts.
2. The answer is what Qwen2.5-Math's evaluation extracts (QwenLM/Qwen2.5-Math a45202b,
   evaluation/parser.py ``extract_answer``), the reference of most reasoning-compression papers:
   the *last* ``\boxed{}`` when several remain, the rest of the text for a ``\boxed{`` cut off by
   the generation length, its "answer is" and last-number fallbacks otherwise.
3. Equivalence is math-verify's (``verify`` on both answers parsed alike), not Qwen's
   ``strip_string`` + ``math_equal``: it agrees on 0.5 = \frac12 = \dfrac{1}{2} and handles sets,
   intervals and equations.
"""

from __future__ import annotations

from ..base import Prompt, Sample, Task
from ..errors import DataError
from ..prompting import build_truncated_prompt
from ..sources import SuiteData, require_fields, sample_id
from .specs import INSTRUCTION
from .verification import is_equivalent, parse_answer

DATA = SuiteData(
    "reasoning",
    "pass --kvbench-data <folder with {file}> (one JSON record per line with 'problem' and 'answer', as the hub "
    "dataset has them), or load the hub dataset once online through datasets; "
    "--kvbench-data fixtures runs the packaged samples",
)


class ReasoningTask(Task):
    suite = "reasoning"

    def _validate(self, record, where: str) -> dict:
        require_fields(record, where, {"problem": str, "answer": (str, int)})
        if not parse_answer(str(record["answer"])):
            raise DataError(f"{where}: math-verify cannot parse the reference answer {record['answer']!r}")
        return record

    def load_samples(self, tokenizer=None, n: int | None = None, seed: int = 0, data_dir=None,
                     context_length: int | None = None) -> list[Sample]:
        """The first ``n`` problems in file order (``seed`` and ``context_length`` do not apply)."""
        samples = []
        for source, record in DATA.records(self.spec.data_file, self._validate, data_dir, n, hub=self.spec.hub):
            key = "unique_id" if "unique_id" in record else "id"
            own_id = sample_id(record, self.spec.name, source, key=key)
            samples.append(Sample(id=f"{self.spec.name}:{own_id}", answers=[str(record["answer"])],
                                  fields=dict(record, source=source)))
        return samples

    def prompt_text(self, sample: Sample) -> str:
        return f"{sample.fields['problem']}\n{INSTRUCTION}"

    def build_prompt(self, sample: Sample, tokenizer, max_prompt_tokens: int | None) -> Prompt:
        return build_truncated_prompt(tokenizer, self.prompt_text(sample), INSTRUCTION, None, use_chat=True)

    def score(self, prediction: str, sample: Sample) -> float:
        return float(is_equivalent(prediction or "", sample.answers[0]))
