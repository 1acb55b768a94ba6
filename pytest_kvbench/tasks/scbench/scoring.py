"""SCBench's scorers for its string-retrieval and QA tasks, equal to scbench/compute_scores.py.

``label`` is what run_scbench.py stores per turn (eval_utils.get_ground_truth): the turn's
``answer``, wrapped in a list for scbench_qa_eng, ``[answer, its letter]`` for scbench_choice_eng. Quirks reproduced:

* substring_match (SCBench's get_score_one_kv_retrieval, used for scbench_kv and
  scbench_prefix_suffix): the label anywhere in the raw prediction, case-sensitive; unlike
  InfiniteBench's word match, a value glued to other characters still counts.
* any_reference_in_prediction (SCBench's get_score_one_longdialogue_qa_eng, used for
  scbench_qa_eng): 1 when any reference, upper-cased, is a substring of the stripped, upper-cased
  prediction; a free-form QA answer is scored by containment, not F1.
* string_match_all (scbench_vt): the share of references contained in the prediction, case-
  insensitive, rounded to 2 decimals (so 2 of 3 scores 0.67, not 0.666...).
"""

from __future__ import annotations

from ..infinitebench.scoring import longbook_choice_eng


def substring_match(prediction: str, label) -> float:
    return float(label in prediction)


def any_reference_in_prediction(prediction: str, label) -> float:
    prediction = prediction.strip().upper()
    return float(any(reference.upper() in prediction for reference in label))


def string_match_all(prediction: str, label) -> float:
    found = sum(1.0 if reference.lower() in prediction.lower() else 0.0 for reference in label)
    return round(found / len(label), 2)


SCORERS = {
    "substring_match": substring_match,
    "any_reference_in_prediction": any_reference_in_prediction,
    "string_match_all": string_match_all,
    "choice": longbook_choice_eng,  # label [option text, letter]; quirks in infinitebench/scoring.py
}
