"""InfiniteBench's scorers, equal to src/compute_scores.py of OpenBMB/InfiniteBench.

``label`` is what the official eval_utils.get_answer stores as the ground truth: the record's
``answer``, except for the two choice tasks, where it is ``[option text, option letter]``.
Every scorer returns a float in [0, 1]. Quirks of the official code that this reproduces:

* passkey / number_string: only the first run of digits in the prediction counts
  ("71432. Or 1" -> "71432"); it is compared as a string with the first label.
* kv_retrieval: the prediction is split into words after ``\\n : " ' . , ? ! { }`` become
  spaces; the value must be one whole word (a value glued to other text by ``-`` or ``)`` is
  missed). The released data files hold the answer as a one-element list, which the official
  ``label in words`` would never find; the first element is compared, as passkey does.
* code_run: only the last word of the prediction (after ``\\n . ` ' " :`` become spaces) is
  read, as an integer; "-3" reads as -3, "x=3" as no answer.
* code_debug: a prediction starting with "B." or "B:" (the right letter) is right; otherwise the
  first of "answer is:", "is:", "answer:" found (after ``\\n ` ' " - *`` and the words
  Option/option become spaces and runs of spaces are squeezed) decides: the text after the
  prefix and one character must start with the letter or the function name. "Option B" alone
  scores 0, and so does a bare "B".
* math_find: the first number in the prediction (``\\d+\\.\\d+|\\d+``: no sign, so "-5" reads as 5)
  is compared with the label as int or float. The official code calls ``int()`` on a decimal
  string when the label is an int, which raises; here that prediction scores 0.
* longdialogue_qa_eng: words (split as kv_retrieval) are upper-cased and only the first label
  is looked for, as given (a label with lower-case letters can never match).
* longbook_choice_eng: the first character decides when it is one of A-D; else the whole
  stripped prediction equal to the option text or letter; else the first of "answer is:",
  "answer:", "answer is", "option is" (after ``\\n " ' . , ? ! { }`` become spaces), then the text
  after it and one character must start with the option text or letter; else the first word
  that is a substring of "ABCD" (so "BC" or "ABCD" count as a choice, and a wrong one ends
  the search).
* longbook_qa_eng: SQuAD token F1 (the LongBench normalisation), best over the answers.
* longbook_qa_chn: character F1: lower-case, Chinese and ASCII punctuation removed, whitespace
  removed, then one character per token (not jieba words, unlike LongBench).
* longbook_sum_eng: ``evaluate``'s "rouge" metric, ``rougeLsum`` F-measure (rouge-score, no
  stemming, its default tokenizer: lower case, runs of [a-z0-9]; sentences are lines), best over
  the answers as rouge-score's ``score_multi`` does.
* math_calc: every run of digits of the prediction is a number (so a minus sign is lost and a
  negative intermediate value never matches); the score is the length of the prefix of the
  label matched in order, over the label's length.
"""

from __future__ import annotations

import re
import string

from ..metrics import CHINESE_PUNCTUATION, qa_f1, token_f1

_RETRIEVAL_SEPARATORS = ("\n", ":", '"', "'", ".", ",", "?", "!", "{", "}")
_CODE_RUN_SEPARATORS = ("\n", ".", "`", "'", '"', ":")
_CODE_DEBUG_SEPARATORS = ("\n", "`", "'", '"', "-", "*", "Option", "option")
_CHOICE_SEPARATORS = ("\n", '"', "'", ".", ",", "?", "!", "{", "}")
_CODE_DEBUG_PREFIXES = ("answer is:", "is:", "answer:")
_CHOICE_PREFIXES = ("answer is:", "answer:", "answer is", "option is")
_FIRST_NUMBER = re.compile(r"\d+\.\d+|\d+")
_NOT_DIGIT = re.compile("[^0-9]")
_ZH_PUNCTUATION = frozenset(CHINESE_PUNCTUATION + string.punctuation)


def _first(label):
    return label[0] if isinstance(label, list) else label


def _replace_all(text: str, separators) -> str:
    for separator in separators:
        text = text.replace(separator, " ")
    return text


def _squeeze_spaces(text: str) -> str:
    while "  " in text:
        text = text.replace("  ", " ")
    return text


def digit_runs(prediction: str) -> list[str]:
    return [run for run in _NOT_DIGIT.split(prediction) if run]


def first_digit_run(prediction: str) -> str:
    runs = digit_runs(prediction)
    return runs[0] if runs else ""


def passkey(prediction: str, label) -> float:
    return float(first_digit_run(prediction) == _first(label))


def kv_retrieval(prediction: str, label) -> float:
    return float(_first(label) in _replace_all(prediction, _RETRIEVAL_SEPARATORS).split())


def code_run(prediction: str, label) -> float:
    words = _replace_all(prediction.strip(), _CODE_RUN_SEPARATORS).split()
    if not words:
        return 0.0
    try:
        return float(int(words[-1]) == _first(label))
    except ValueError:
        return 0.0


def _after_prefix(text: str, prefixes) -> str | None:
    """The text after the first prefix found and one more character; "" when it ends there;
    None when no prefix occurs."""
    for prefix in prefixes:
        index = text.find(prefix)
        if index == -1:
            continue
        if len(text) < index + len(prefix) + 1:
            return ""
        return text[index + len(prefix) + 1:]
    return None


def code_debug(prediction: str, label) -> float:
    function_name, letter = label[0], label[1]
    prediction = prediction.strip()
    if prediction[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    rest = _after_prefix(_squeeze_spaces(_replace_all(prediction, _CODE_DEBUG_SEPARATORS)), _CODE_DEBUG_PREFIXES)
    return float(bool(rest) and rest.startswith((letter, function_name)))


def math_find(prediction: str, label) -> float:
    label = _first(label)
    match = _FIRST_NUMBER.search(prediction)
    if match is None:
        return 0.0
    if isinstance(label, int):
        return float(match.group(0).isdigit() and int(match.group(0)) == label)
    return float(float(match.group(0)) == label)


def longdialogue_qa_eng(prediction: str, label) -> float:
    words = [word.upper() for word in _replace_all(prediction.strip(), _RETRIEVAL_SEPARATORS).split()]
    return float(label[0] in words)


def longbook_choice_eng(prediction: str, label) -> float:
    prediction = prediction.strip()
    if not prediction:
        return 0.0
    if prediction[0] in "ABCD":
        return float(prediction[0] in label)
    if prediction in label:
        return 1.0
    prediction = _squeeze_spaces(_replace_all(prediction, _CHOICE_SEPARATORS))
    rest = _after_prefix(prediction, _CHOICE_PREFIXES)
    if rest is not None:
        return float(bool(rest) and any(rest.startswith(option) for option in label))
    for word in prediction.split():
        if word in "ABCD":
            return float(word in label)
    return 0.0


def longbook_qa_eng(prediction: str, label) -> float:
    return max((qa_f1(prediction, reference) for reference in label), default=0.0)


def _chinese_characters(text: str) -> list[str]:
    return [ch for ch in text.lower() if ch not in _ZH_PUNCTUATION and not ch.isspace()]


def longbook_qa_chn(prediction: str, label) -> float:
    return max((token_f1(_chinese_characters(prediction), _chinese_characters(reference)) for reference in label),
               default=0.0)


def longbook_sum_eng(prediction: str, label) -> float:
    # lazy for startup time: rouge_score, only when a ROUGE task is scored
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)
    references = label if isinstance(label, list) else [label]
    return float(scorer.score_multi(references, prediction)["rougeLsum"].fmeasure)


def math_calc(prediction: str, label) -> float:
    if isinstance(label[0], list):
        label = label[0]
    numbers = [int(run) for run in digit_runs(prediction)]
    matched = 0
    for expected, got in zip(label, numbers):
        if expected != got:
            break
        matched += 1
    return matched / len(label)


SCORERS = {
    "passkey": passkey, "number_string": passkey, "kv_retrieval": kv_retrieval, "code_run": code_run,
    "code_debug": code_debug, "math_find": math_find, "math_calc": math_calc,
    "longdialogue_qa_eng": longdialogue_qa_eng, "longbook_choice_eng": longbook_choice_eng,
    "longbook_qa_eng": longbook_qa_eng, "longbook_qa_chn": longbook_qa_chn, "longbook_sum_eng": longbook_sum_eng,
}
