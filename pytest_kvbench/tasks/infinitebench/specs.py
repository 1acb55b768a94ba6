"""Per-task facts of InfiniteBench, as OpenBMB/InfiniteBench's src/ defines them.

Templates are ``yarn_mistral_templates`` of src/prompt.py: the set the official scripts use for
open models (eval_yarn_mistral.py, and Yi-200K and ChatGLM3 through MODEL_TO_PROMPT_TEMPLATE),
fed as plain text without a chat template, each ending in an answer lead-in ("The pass key is").
Generation lengths are DATA_NAME_TO_MAX_NEW_TOKENS of src/eval_utils.py, data files
DATA_NAME_TO_PATH. Kept verbatim, spacing included.
"""

from __future__ import annotations

from ..prompting import TemplateSpec

_CHOICES = "A. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}"

TEMPLATES: dict[str, str] = {
    "passkey": (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is"
    ),
    "number_string": (
        "There is an important info hidden inside a lot of irrelevant text. Find it. "
        "I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is"
    ),
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "longbook_choice_eng": (
        "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n"
        + _CHOICES + "\n\nThe letter of the correct answer is"
    ),
    "longbook_qa_eng": (
        "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\nQuestion: {question}\nAnswer:"
    ),
    "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "longdialogue_qa_eng": (
        "Below is a dialogue script where one random occurrence of a character name is replaced with \"$$MASK$$\", "
        "and you should try to guess who that character is.\n\n{context}\n\n"
        "The name that has been replaced with $$MASK$$ is likely"
    ),
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": (
        "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + 4\nValues: [1, 4, 8]\n\n"
        "Expression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\nExpression: {context}\nValues:"
    ),
    "code_run": (
        "There is a function called {func} in the following Python code.\n\n{context}\n\n"
        "Please compute the exact value of {func_call}. The value of {func_call} is"
    ),
    "code_debug": (
        "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it "
        "crash.\n\n{context}\n\nOptions:\n" + _CHOICES + "\n\nThe correct option is:"
    ),
}

MAX_NEW_TOKENS: dict[str, int] = {
    "passkey": 6, "number_string": 12, "kv_retrieval": 50, "longbook_sum_eng": 1200,
    "longbook_choice_eng": 40, "longbook_qa_eng": 40, "longbook_qa_chn": 40, "longdialogue_qa_eng": 40,
    "math_find": 3, "math_calc": 30000, "code_run": 5, "code_debug": 5,
}

# The paper's names (Retrieve.PassKey, En.Sum, ...) -> the metric this harness reports.
METRIC_NAMES: dict[str, str] = {
    "passkey": "accuracy", "number_string": "accuracy", "kv_retrieval": "accuracy",
    "longbook_sum_eng": "rouge_lsum", "longbook_choice_eng": "accuracy", "longbook_qa_eng": "qa_f1",
    "longbook_qa_chn": "qa_f1_zh_chars", "longdialogue_qa_eng": "accuracy", "math_find": "accuracy",
    "math_calc": "prefix_accuracy", "code_run": "accuracy", "code_debug": "accuracy",
}
PAPER_NAMES: dict[str, str] = {
    "passkey": "Retrieve.PassKey", "number_string": "Retrieve.Number", "kv_retrieval": "Retrieve.KV",
    "longbook_sum_eng": "En.Sum", "longbook_qa_eng": "En.QA", "longbook_choice_eng": "En.MC",
    "longdialogue_qa_eng": "En.Dia", "longbook_qa_chn": "Zh.QA", "code_debug": "Code.Debug",
    "code_run": "Code.Run", "math_calc": "Math.Calc", "math_find": "Math.Find",
}


def infinitebench_specs() -> dict[str, TemplateSpec]:
    return {name: TemplateSpec(name, TEMPLATES[name], MAX_NEW_TOKENS[name], METRIC_NAMES[name]) for name in PAPER_NAMES}
