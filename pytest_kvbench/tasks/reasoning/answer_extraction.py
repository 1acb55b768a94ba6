"""The answer of a reasoning output: the reasoning block dropped, then Qwen2.5-Math's extraction.

Reasoning-compression papers score MATH-500 and AIME with the Qwen2.5-Math evaluation
(QwenLM/Qwen2.5-Math, commit a45202b, evaluation/parser.py ``extract_answer``); this module follows
it for the data sets of this suite (none of its multiple-choice branches apply):

* R1-style models write ``<think> ... </think>`` before the answer, and chat templates such as
  DeepSeek-R1-Distill's or Qwen3's open ``<think>`` in the prompt, so the output only closes it.
  Either way the answer is the text after the last ``</think>`` (DeepSeek-R1's own split of
  reasoning and answer); an output without ``</think>`` is all answer (a model that does not think,
  or a reasoning cut off by the generation length, whose boxed answer, if any, still counts).
  Qwen2.5-Math predates thinking models: this step is the harness's, done before its extraction.
* ``extract_answer``: Minerva's "final answer is $...$. I hope" first; else, when "boxed" occurs,
  the text after its *last* occurrence: the brace-balanced content of ``{...}``, or, when the output
  was cut off inside it, everything to the end of the text; ``\\boxed 5$`` (no brace) gives what
  precedes the next ``$``; else the text after the last "he answer is", or "final answer is"
  (or after the first Chinese "答案是", to the next blank line); else the last number (commas
  dropped). Then line breaks and the whitespace after them are removed, and one leading ``:``
  and one trailing ``.`` and ``/`` are dropped.
* Not followed: ``strip_string`` (Qwen's normalisation of units, ``\\text``, ``\\dfrac``, spaces)
  and ``math_equal``: equivalence stays with math-verify (verification.py), which parses the
  extracted answer the way it parses the reference and normalises both.
"""

from __future__ import annotations

import re

REASONING_END = "</think>"
_LAST_NUMBER = re.compile(r"-?\d*\.?\d+")


def strip_reasoning(output: str) -> str:
    """The text after the last ``</think>``; the whole output when there is none."""
    return output.rsplit(REASONING_END, 1)[-1]


def _last_boxed(text: str) -> str:
    """The content after the last "boxed": balanced braces, or the rest of a cut-off ``\\boxed{``."""
    tail = text.split("boxed")[-1]
    if not tail:
        return ""
    if tail[0] != "{":
        return tail.split("$")[0].strip()
    depth, content = 1, []
    for char in tail[1:]:
        depth += (char == "{") - (char == "}")
        if depth == 0:
            break
        content.append(char)
    return "".join(content)


def extract_answer(output: str) -> str:
    """Qwen2.5-Math's ``extract_answer`` (``use_last_number=True``) up to ``strip_string``."""
    text = output.replace("\u043a\u0438", "")  # "ки": the step tag of Qwen's reward-model data
    if "final answer is $" in text and "$. I hope" in text:
        answer = text.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in text:
        answer = _last_boxed(text)
    elif "he answer is" in text:
        answer = text.split("he answer is")[-1].strip()
    elif "final answer is" in text:
        answer = text.split("final answer is")[-1].strip()
    elif "\u7b54\u6848\u662f" in text:  # "the answer is" in Chinese: up to the next blank line
        answer = text.split("\u7b54\u6848\u662f")[1].strip().split("\n\n")[0].strip()
    else:
        numbers = _LAST_NUMBER.findall(text.replace(",", ""))
        answer = numbers[-1] if numbers else ""
    answer = re.sub(r"\n\s*", "", answer)
    if answer.startswith(":"):
        answer = answer[1:]
    for end in ".", "/":
        if answer.endswith(end):
            answer = answer[:-1]
    return answer
