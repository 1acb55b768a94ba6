"""The reasoning tasks: where each data set lives and how long a reasoning model may think.

* MATH-500: the 500-problem test subset of MATH chosen by Lightman et al. (2023, "Let's Verify
  Step by Step"), HuggingFaceH4/MATH-500 (test.jsonl: problem, solution, answer, subject,
  level, unique_id).
* AIME 2024: HuggingFaceH4/aime_2024 (30 problems: id, problem, solution, answer, url, year).
* AIME 2025: yentinglin/aime_2025 (30 problems, the same fields): the sets lighteval reads.

The prompt is DeepSeek-R1's recommendation for mathematics (its model card: "Please reason step
by step, and put your final answer within \\boxed{}."), appended to the problem in one user turn.
The generation length defaults to 32,768 tokens, the maximum generation length of DeepSeek-R1's
evaluation (Guo et al. 2025, section 3.1); a name such as ``math500:max_new_tokens=4096``
shortens it. Decoding is the harness's greedy decoding: DeepSeek-R1 reports pass@1 over several
samples at temperature 0.6 and top-p 0.95, so published numbers are not reproduced one to one.
"""

from __future__ import annotations

from dataclasses import dataclass

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MAX_NEW_TOKENS = 32768


@dataclass(frozen=True)
class ReasoningSpec:
    name: str
    hub: dict  # load_dataset arguments
    data_file: str  # the file read from --kvbench-data DIR (one record per line, the hub's fields)
    max_new_tokens: int = MAX_NEW_TOKENS
    metric_name: str = "math_verify"


def reasoning_specs() -> dict[str, ReasoningSpec]:
    return {
        "math500": ReasoningSpec("math500", {"path": "HuggingFaceH4/MATH-500", "split": "test"}, "math500.jsonl"),
        "aime2024": ReasoningSpec("aime2024", {"path": "HuggingFaceH4/aime_2024", "split": "train"}, "aime2024.jsonl"),
        "aime2025": ReasoningSpec("aime2025", {"path": "yentinglin/aime_2025", "split": "train"}, "aime2025.jsonl"),
    }
