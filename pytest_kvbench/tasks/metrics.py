"""LongBench metrics, equal to the official ones (THUDM/LongBench metrics.py and eval.py).

Each metric compares one prediction with one reference and returns a value in [0, 1]; the task
takes the maximum over the references. Definitions follow the official evaluation exactly,
including its quirks, because published numbers depend on them:

* qa F1: SQuAD normalisation (lower case, drop punctuation and the articles a/an/the, squeeze
  whitespace) then token-bag F1; Chinese: jieba words, Chinese+ASCII punctuation removed.
* ROUGE-L: the ``rouge`` package's F score (Chinese: jieba words joined by spaces); any
  failure of the package (empty text) counts as 0, as officially.
* classification: every class name contained in the prediction is a match; a match that is a
  strict substring of the reference is dropped, and, as the official loop removes items from
  the list it is iterating, the match right after a dropped one is kept unexamined. Score is
  1/number of matches when the reference is among them.
* retrieval/count: the share of the numbers in the prediction equal to the expected one.
* code similarity: the first line without a backtick, ``#`` or ``//``, compared with
  fuzzywuzzy's ratio (python-Levenshtein backend): the indel similarity (what rapidfuzz's
  fuzz.ratio computes) rounded to an integer percentage, as fuzzywuzzy returns it.

jieba, rouge and rapidfuzz are imported inside the functions: importing jieba alone costs
about a second, which task collection must not pay.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

CHINESE_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
)
_ASCII_PUNCTUATION = frozenset(string.punctuation)
_ALL_PUNCTUATION = frozenset(string.punctuation + CHINESE_PUNCTUATION)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBERS = re.compile(r"\d+")


def normalize_english(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _ASCII_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def normalize_chinese(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _ALL_PUNCTUATION)
    return "".join(text.split())


def token_f1(predicted: list[str], reference: list[str]) -> float:
    same = sum((Counter(predicted) & Counter(reference)).values())
    if same == 0:
        return 0.0
    precision = same / len(predicted)
    recall = same / len(reference)
    return 2 * precision * recall / (precision + recall)


def jieba_words(text: str) -> list[str]:
    # lazy for startup time: jieba loads its dictionary; only for Chinese tasks
    import jieba

    return list(jieba.cut(text, cut_all=False))


def qa_f1(prediction: str, reference: str, **_) -> float:
    return token_f1(normalize_english(prediction).split(), normalize_english(reference).split())


def qa_f1_zh(prediction: str, reference: str, **_) -> float:
    def words(text: str) -> list[str]:
        return [w for w in (normalize_chinese(token) for token in jieba_words(text)) if w]

    return token_f1(words(prediction), words(reference))


def rouge_l(prediction: str, reference: str, **_) -> float:
    # lazy for startup time: rouge, only when a ROUGE task is scored
    from rouge import Rouge

    try:
        scores = Rouge(metrics=["rouge-l"]).get_scores([prediction], [reference], avg=True)
    except Exception:  # the package raises on empty or degenerate text; officially that scores 0
        return 0.0
    return float(scores["rouge-l"]["f"])


def rouge_l_zh(prediction: str, reference: str, **_) -> float:
    return rouge_l(" ".join(jieba_words(prediction)), " ".join(jieba_words(reference)))


def classification(prediction: str, reference: str, *, all_classes=None, **_) -> float:
    matched = [name for name in (all_classes or []) if name in prediction]
    kept: list[str] = []
    skip_next = False
    for name in matched:
        if skip_next:
            kept.append(name)
            skip_next = False
        elif name in reference and name != reference:
            skip_next = True
        else:
            kept.append(name)
    return 1.0 / len(kept) if reference in kept else 0.0


def _share_of_numbers_equal(prediction: str, expected: str) -> float:
    numbers = _NUMBERS.findall(prediction)
    if not numbers:
        return 0.0
    return sum(number == expected for number in numbers) / len(numbers)


def count(prediction: str, reference: str, **_) -> float:
    return _share_of_numbers_equal(prediction, str(reference))


def _retrieval(pattern: str) -> Callable[..., float]:
    compiled = re.compile(pattern)

    def score(prediction: str, reference: str, **_) -> float:
        found = compiled.findall(reference)
        return _share_of_numbers_equal(prediction, found[0]) if found else 0.0

    return score


retrieval = _retrieval(r"Paragraph (\d+)")
retrieval_zh = _retrieval(r"段落(\d+)")


def first_code_line(prediction: str) -> str:
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


def fuzzywuzzy_ratio(a: str, b: str) -> int:
    """fuzzywuzzy.fuzz.ratio with python-Levenshtein: equal strings 100, an empty one 0, otherwise
    ``round(100 * (lensum - indel_distance) / lensum)``, computed in the same order of float
    operations (rapidfuzz gives the indel distance) so halves round the same way."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    # lazy for startup time: rapidfuzz, only for code tasks
    from rapidfuzz.distance import Indel

    total = len(a) + len(b)
    return round(100 * ((total - Indel.distance(a, b)) / total))


def code_sim(prediction: str, reference: str, **_) -> float:
    return fuzzywuzzy_ratio(first_code_line(prediction), reference) / 100


METRICS: dict[str, Callable[..., float]] = {
    "qa_f1": qa_f1,
    "qa_f1_zh": qa_f1_zh,
    "rouge_l": rouge_l,
    "rouge_l_zh": rouge_l_zh,
    "classification": classification,
    "retrieval": retrieval,
    "retrieval_zh": retrieval_zh,
    "count": count,
    "code_sim": code_sim,
}


def first_line(prediction: str) -> str:
    """The official first-line rule for few-shot tasks: drop leading newlines, keep line one."""
    return prediction.lstrip("\n").split("\n")[0]


def best_over_references(metric: Callable[..., float], prediction: str, references: list[str],
                         **kwargs) -> float:
    """Maximum of the metric over the references (0 when there are none)."""
    best = 0.0
    for reference in references:
        best = max(best, metric(prediction, reference, **kwargs))
    return float(best)
