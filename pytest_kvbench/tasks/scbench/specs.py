"""Per-task facts of the SCBench tasks this harness runs, from microsoft/MInference's scbench/.

Templates are ``multiturn_templates`` of eval_utils.py (the first turn's prompt: template with
the context and that turn's question), generation lengths DATA_NAME_TO_MAX_NEW_TOKENS, and the
scorer is the InfiniteBench-derived one compute_scores.py maps each task to
(``Multiturnbench_to_Infinitebench``): kv and prefix_suffix use SCBench's own kv_retrieval
(substring), qa_eng its longdialogue_qa_eng (substring of any reference, case-insensitive), vt
``string_match_all``, choice_eng InfiniteBench's longbook_choice_eng (the same code in both). The official runs use the chat template (scripts/run_all_tasks.sh passes
``--use_chat_template``) and at most 5 turns per context (``--max_turns`` default). Later turns use
``multiturn_follow_up_templates`` / ``multiturn_follow_up_templates_in_chat_tempate``
(conversation.py builds the turns from them).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..prompting import TemplateSpec

MAX_TURNS = 5

_KV = "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}"
TEMPLATES = {
    "scbench_kv": _KV,
    "scbench_prefix_suffix": "{context}\n\n{input}",
    "scbench_vt": "{context}\n\n{input}",
    "scbench_qa_eng": (
        "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\n"
        "Question: {input}\nAnswer:"
    ),
    # "The the" is in the official template.
    "scbench_choice_eng": (
        "Read the book and answer the question.\n\n{context}\n\nQuestion: {input}\n"
        "A. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe the correct answer is"
    ),
}
_CHOICE_QUESTION = "Question: {input}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\n"
# A later turn's user text: multiturn_follow_up_templates_in_chat_tempate (under the chat template, and
# without it for the model's own history) and, without the chat template and with gold history,
# multiturn_follow_up_templates, which put the previous turn's gold answer first ("{pre_ans}").
FOLLOW_UPS = {
    "scbench_kv": "{input}", "scbench_prefix_suffix": "{input}", "scbench_vt": "{input}",
    "scbench_qa_eng": "Question: {input}\nAnswer:",
    "scbench_choice_eng": _CHOICE_QUESTION + "The the correct answer is",
}
GOLD_FOLLOW_UPS = {
    "scbench_kv": "{pre_ans}\n\n{input}", "scbench_prefix_suffix": "{pre_ans}\n\n{input}",
    "scbench_vt": "{pre_ans}\n\n{input}", "scbench_qa_eng": "{pre_ans}\n\nQuestion: {input}\nAnswer:",
    "scbench_choice_eng": "{pre_ans}\n\n" + _CHOICE_QUESTION + "The letter of the correct answer is",
}
MAX_NEW_TOKENS = {"scbench_kv": 150, "scbench_prefix_suffix": 150, "scbench_vt": 30, "scbench_qa_eng": 40,
                  "scbench_choice_eng": 40}
METRIC_NAMES = {
    "scbench_kv": "substring_match", "scbench_prefix_suffix": "substring_match",
    "scbench_vt": "string_match_all", "scbench_qa_eng": "any_reference_in_prediction",
    "scbench_choice_eng": "choice",
}


@dataclass(frozen=True)
class SCBenchSpec(TemplateSpec):
    """A TemplateSpec with the later turns' templates and the conversation's history (a task setting:
    ``scbench_kv:history=model``)."""

    follow_up: str = ""
    gold_follow_up: str = ""
    history: str = "gold"


def scbench_specs() -> dict[str, SCBenchSpec]:
    return {name: SCBenchSpec(name, TEMPLATES[name], MAX_NEW_TOKENS[name], METRIC_NAMES[name], FOLLOW_UPS[name],
                              GOLD_FOLLOW_UPS[name]) for name in TEMPLATES}
