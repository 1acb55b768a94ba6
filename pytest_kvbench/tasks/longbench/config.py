"""Per-task facts of LongBench, as officially defined.

Prompt templates come from config/dataset2prompt.json and generation lengths from
config/dataset2maxlen.json of THUDM/LongBench; the metric per task, the tasks that skip the
chat template and the tasks scored on the first line come from pred.py and eval.py. They are
kept verbatim (spacing included) because a changed prompt changes the benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

_PASSAGES_QA = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nThe following are given passages.\n{context}\n\n"
    "Answer the question based on the given passages. Only give me the answer and do not output any other words."
    "\n\nQuestion: {input}\nAnswer:"
)
_QASPER_INSTRUCTIONS = (
    "Answer the question based on the above article as concisely as you can, using a single phrase or sentence "
    "if possible. If the question cannot be answered based on the information in the article, write "
    "\"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". "
    "Do not provide any explanation."
)

PROMPTS: dict[str, str] = {
    "narrativeqa": (  # "asconcisely": the official typo, kept
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
        "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n"
        "Story: {context}\n\n"
        "Now, answer the question based on the story asconcisely as you can, using a single phrase if possible. "
        "Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. "
        + _QASPER_INSTRUCTIONS.replace("Answer the question based on the above article as", "Answer the question as")
        + "\n\nArticle: {context}\n\n " + _QASPER_INSTRUCTIONS + "\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\n"
        "Now, answer the following question based on the above text, only give me the answer and do not output "
        "any other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "multifieldqa_zh": (
        "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。"
        "\n\n问题：{input}\n回答："
    ),
    "hotpotqa": _PASSAGES_QA,
    "2wikimqa": _PASSAGES_QA,
    "musique": _PASSAGES_QA,
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
        "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
        "one or more sentences.\n\nTranscript:\n{context}\n\n"
        "Now, answer the query based on the above meeting transcript in one or more sentences.\n\n"
        "Query: {input}\nAnswer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
        "Now, write a one-page summary of all the news.\n\nSummary:"
    ),
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other words. "
        "The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully "
        "read these paragraphs and determine how many unique paragraphs there are after removing duplicates. "
        "In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\n"
        "Please enter the final count of unique paragraphs after removing duplicates. The output format should "
        "only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\n"
        "Please enter the number of the paragraph that the abstract is from. The answer format must be like "
        "\"Paragraph 1\", \"Paragraph 2\", etc.\n\nThe answer is: "
    ),
    "passage_retrieval_zh": (
        "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n"
        "请输入摘要所属段落的编号。答案格式必须是\"段落1\"，\"段落2\"等格式\n\n答案是："
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

MAX_NEW_TOKENS: dict[str, int] = {
    "narrativeqa": 128, "qasper": 128, "multifieldqa_en": 64, "multifieldqa_zh": 64,
    "hotpotqa": 32, "2wikimqa": 32, "musique": 32, "dureader": 128,
    "gov_report": 512, "qmsum": 512, "multi_news": 512, "vcsum": 512,
    "trec": 64, "triviaqa": 32, "samsum": 128, "lsht": 64,
    "passage_count": 32, "passage_retrieval_en": 32, "passage_retrieval_zh": 32,
    "lcc": 64, "repobench-p": 64,
}

METRIC_NAMES: dict[str, str] = {
    "narrativeqa": "qa_f1", "qasper": "qa_f1", "multifieldqa_en": "qa_f1", "multifieldqa_zh": "qa_f1_zh",
    "hotpotqa": "qa_f1", "2wikimqa": "qa_f1", "musique": "qa_f1", "dureader": "rouge_l_zh",
    "gov_report": "rouge_l", "qmsum": "rouge_l", "multi_news": "rouge_l", "vcsum": "rouge_l_zh",
    "trec": "classification", "triviaqa": "qa_f1", "samsum": "rouge_l", "lsht": "classification",
    "passage_count": "count", "passage_retrieval_en": "retrieval", "passage_retrieval_zh": "retrieval_zh",
    "lcc": "code_sim", "repobench-p": "code_sim",
}

ENGLISH_TASKS = (
    "narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "gov_report", "qmsum",
    "multi_news", "trec", "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
)
CHINESE_TASKS = ("multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh")
# LongBench-E: the tasks re-sampled with uniform length, scored per length bucket.
E_TASKS = (
    "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news",
    "trec", "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
)
# Few-shot and code tasks: chat models do better without the chat template (pred.py).
NO_CHAT_TEMPLATE = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})
# Few-shot tasks: only the first line of the prediction is scored (eval.py).
FIRST_LINE_ONLY = frozenset({"trec", "triviaqa", "samsum", "lsht"})
# LongBench-E length buckets on the record's ``length`` field: [lower bound, label).
LENGTH_BUCKETS = ((0, "0-4k"), (4000, "4-8k"), (8000, "8k+"))


@dataclass(frozen=True)
class LongBenchSpec:
    """Everything that defines one LongBench task."""

    name: str  # registry name, e.g. "qasper" or "qasper_e"
    dataset: str  # official dataset name whose prompt, length and metric apply
    prompt: str
    max_new_tokens: int
    metric_name: str
    use_chat_template: bool
    first_line_only: bool
    length_buckets: bool


def longbench_specs() -> dict[str, LongBenchSpec]:
    specs = {}
    for name in ENGLISH_TASKS + CHINESE_TASKS:
        specs[name] = _spec(name, name, length_buckets=False)
    for name in E_TASKS:
        specs[f"{name}_e"] = _spec(f"{name}_e", name, length_buckets=True)
    return specs


def _spec(name: str, dataset: str, *, length_buckets: bool) -> LongBenchSpec:
    return LongBenchSpec(
        name=name,
        dataset=dataset,
        prompt=PROMPTS[dataset],
        max_new_tokens=MAX_NEW_TOKENS[dataset],
        metric_name=METRIC_NAMES[dataset],
        use_chat_template=dataset not in NO_CHAT_TEMPLATE,
        first_line_only=dataset in FIRST_LINE_ONLY,
        length_buckets=length_buckets,
    )
