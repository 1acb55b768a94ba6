"""RESULTS.md tables: full row first, Avg, best compressed score in bold, needle heatmaps."""

import json

import pytest

from pytest_kvbench.results.record import Record
from pytest_kvbench.results.views.task_averages import task_average_tables
from pytest_kvbench.results.views.table_formats import to_json, to_latex
from pytest_kvbench.results.views.tables import budget_tables, needle_heatmaps, results_markdown

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def record(method, budget, task, score, ctx=None, samples=None, kl=0.1, **fields):
    """A hand-made record whose key is not a key (its item id): the views label it from its fields."""
    item = f"{method}-{task}" if budget == "full" else f"{method}-{budget}-{task}"
    return Record.from_json({
        "item_id": item, "key": item, "status": "passed", "score": score,
        "model": {"name": "m"}, "method": {"name": method, "params": {}}, "budget": {"spec": budget},
        "task": {"name": task, "context_length": ctx}, "fidelity": {"kl": kl, "agreement": 0.5},
        "memory": {"kv_bytes_after": 2**20}, "samples": samples or [],
    } | fields)


RECORDS = [
    record("full", "full", "qasper", 40.0, kl=0.0),
    record("full", "full", "trec", 60.0, kl=0.0),
    record("snapkv", "128", "qasper", 35.0),
    record("snapkv", "128", "trec", 50.0),
    record("h2o", "128", "qasper", 30.0),
    record("h2o", "128", "trec", 55.0),
]


def test_one_table_per_budget_with_reference_avg_and_bold_best():
    ((heading, table),) = budget_tables(RECORDS)
    assert heading == "m — budget 128"
    lines = table.splitlines()
    assert lines[0].split("|")[1].strip() == "Method"
    assert [c.strip() for c in lines[0].split("|")[2:5]] == ["qasper", "trec", "Avg"]
    full, h2o, snap = (next(l for l in lines if l.startswith(f"| {m}")) for m in ("full", "h2o", "snapkv"))
    assert lines.index(full) == 2  # the reference row comes first
    assert "50.00" in full  # (40 + 60) / 2
    assert "**35.00**" in snap and "**55.00**" in h2o  # best compressed per column
    assert "**42.50**" not in h2o + snap  # every compressed method ties on Avg: no bold
    assert "0.0000" in full


def test_no_bold_when_every_compressed_method_ties():
    tied = [record("full", "full", "trec", 10.0), record("snapkv", "64", "trec", 0.0), record("h2o", "64", "trec", 0.0)]
    ((_, table),) = budget_tables(tied)
    assert "**" not in table


def test_needle_heatmap_is_depth_by_length():
    samples = [{"score": 1.0, "fields": {"depth": d, "context_length": 1024}} for d in (0, 50)]
    samples.append({"score": 0.0, "fields": {"depth": 100, "context_length": 1024}})
    recs = [record("snapkv", "64", "niah_grid", 66.67, ctx=1024, samples=samples)]
    ((heading, table),) = needle_heatmaps(recs)
    assert "niah_grid" in heading and "snapkv" in heading
    rows = table.splitlines()
    assert "1024" in rows[0]
    assert rows[2].startswith("| 0%") and "100" in rows[2]
    assert rows[-1].startswith("| 100%") and rows[-1].rstrip("| ").endswith("0")
    markdown = results_markdown({"run_id": "r", "complete": True}, recs)
    assert "Needle in a haystack" in markdown


def test_incomplete_runs_and_zero_scores_are_flagged():
    markdown = results_markdown({"run_id": "r", "complete": False}, RECORDS + [record("random", "128", "trec", 0.0)])
    assert "(incomplete)" in markdown
    assert "`random-128-trec`" in markdown


def test_byte_budget_tables_show_measured_bytes_peak_memory_and_the_share_of_the_budget_used():
    def at_bytes(method, stored, budget_bytes):
        return record(method, "m0.25", "trec", 10.0, samples=[
            {"kv_bytes_physical": stored, "kv_bytes_budget": budget_bytes},
            {"kv_bytes_physical": stored // 2, "kv_bytes_budget": budget_bytes}],
            memory={"kv_bytes_after": stored, "peak_bytes": 3 * 2**20},
            latency={"decode_tokens_per_s": 90.0, "decode_tokens_per_s_alone": 30.0 if method == "kivi" else 60.0})

    rows = [record("full", "full", "trec", 10.0), at_bytes("snapkv", 2**20, 2**20), at_bytes("kivi", 2**21, 2**20)]
    ((heading, table),) = budget_tables(rows)
    assert heading == "m — budget m0.25"
    header = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    assert header[-4:] == ["KV MiB", "Dec tok/s", "Peak MiB", "KV/budget"]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]}
    # (1 + 0.5) / 2 of the budget; the decode speed is the one measured alone, not the batched one
    assert cells["snapkv"][-4:] == ["1.00", "60.0", "3.0", "0.750"]
    assert cells["kivi"][-4:] == ["2.00", "30.0", "3.0", "1.500"]  # over budget, and the table says so
    assert cells["full"][-1] == "-"
    ((_, token_table),) = budget_tables(RECORDS)
    assert "KV/budget" not in token_table and "Peak MiB" in token_table


def test_dec_tok_s_leaves_out_an_item_whose_samples_all_decoded_in_batches():
    """--kvbench-measure-alone method: a method's own speed is measured on one item; its other items' samples all
    decoded in batches and record no speed alone. The row's Dec tok/s is the measured one, not mixed with a batch's
    speed; a record from before batched decoding (no decode_batch) still gives its decode_tokens_per_s."""
    alone = record("snapkv", "128", "trec", 10.0, samples=[{"decode_batch": 1}, {"decode_batch": 4}],
                   latency={"decode_tokens_per_s": 90.0, "decode_tokens_per_s_alone": 30.0})
    batched = record("snapkv", "128", "lcc", 10.0, samples=[{"decode_batch": 4}, {"decode_batch": 4}],
                     latency={"decode_tokens_per_s": 200.0})
    old = record("h2o", "128", "trec", 10.0, samples=[{"decode_ms": 5.0}], latency={"decode_tokens_per_s": 20.0})
    ((_, table),) = budget_tables([record("full", "full", "trec", 10.0), alone, batched, old])
    header = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    column = header.index("Dec tok/s")
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines()[2:]}
    assert cells["snapkv"][column] == "30.0" and cells["h2o"][column] == "20.0"


def test_one_seed_cells_show_the_bootstrap_half_width_over_their_samples():
    half = [{"score": float(i % 2)} for i in range(40)]  # 20 of 40 right: 50 +- about 1.96 * 7.9
    same = [{"score": 1.0} for _ in range(40)]
    ((_, table),) = budget_tables([record("full", "full", "trec", 100.0, samples=same),
                                   record("snapkv", "64", "trec", 50.0, samples=half),
                                   record("h2o", "64", "trec", 0.0, samples=[{"score": 0.0}])])
    rows = {l.split("|")[1].strip(): l.split("|")[2].strip() for l in table.splitlines()[2:]}
    mean, half_width = rows["snapkv"].strip("*").split(" ± ")
    assert mean == "50.00" and 13.0 < float(half_width) < 18.0
    assert rows["full"] == "100.00 ± 0.00"  # every sample right: no spread seen
    assert rows["h2o"] == "0.00"  # one sample: no interval


def test_results_md_says_the_command_versions_and_whether_the_tree_was_dirty():
    environment = {"git_commit": "abc123", "git_dirty": True, "command": "pytest bench/test_ruler.py",
                   "python": "3.11.7", "platform": "Linux-x86_64",
                   "versions": {"pytest-kvbench": "0.1.0", "torch": "2.13.0", "transformers": "5.24.0", "datasets": None}}
    markdown = results_markdown({"run_id": "r", "start": "2026-11-26T10:26:00", "environment": environment}, RECORDS)
    assert "commit `abc123`" in markdown and "2026-11-26T10:26:00" in markdown
    assert ("Made by `pytest bench/test_ruler.py` with Python 3.11.7, pytest-kvbench 0.1.0, torch 2.13.0, "
            "transformers 5.24.0; Linux-x86_64; tree (with uncommitted changes).") in markdown
    assert "datasets" not in markdown


def test_averages_over_tasks_one_table_per_model_method_by_budget_with_a_stratified_interval():
    def scores(right, n=20):
        return [{"score": 1.0 if i < right else 0.0} for i in range(n)]

    recs = [record("full", "full", "a", 100.0, samples=scores(20)), record("full", "full", "b", 100.0, samples=scores(20))]
    for budget, (a, b) in {"m0.125": (10, 20), "m0.25": (20, 20)}.items():
        recs += [record("snapkv", budget, "a", a * 5.0, samples=scores(a)), record("snapkv", budget, "b", b * 5.0, samples=scores(b))]
    recs.append(record("h2o", "m0.125", "a", 0.0, samples=scores(0)))  # no task b: no average
    ((heading, table),) = task_average_tables(recs)
    assert heading == "m — Avg over 2 tasks"
    lines = table.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:4]] == ["Method", "m0.125", "m0.25"]
    rows = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:4]] for l in lines[2:]}
    assert rows["full"] == ["100.0 ± 0.0", "100.0 ± 0.0"]
    mean, half = rows["snapkv"][0].split(" ± ")
    assert mean == "75.0" and 8.0 < float(half) < 14.0  # task a alone: 50 +- ~22, halved by the average over 2
    assert rows["snapkv"][1] == "100.0 ± 0.0"
    assert rows["h2o"] == ["-", "-"]
    assert "## Averages over tasks" in results_markdown({"run_id": "r"}, recs)


def test_a_run_at_several_context_lengths_gets_tables_and_averages_per_length():
    """RULER at 8k with one task also at 16k for a few methods: one budget table per length (a row's Avg, KL and
    KV MiB never mix lengths); the 8k rows are averaged over the 8k tasks alone (h2o, without the 16k item, still
    gets its average), and the single 16k task gets no average table."""
    same = [{"score": 1.0}, {"score": 0.0}]
    recs = [record(m, b, t, 50.0, ctx=8192, samples=same) for m, b in [("full", "full"), ("snapkv", "m0.125"),
                                                                      ("h2o", "m0.125")] for t in ("a", "b")]
    recs += [record(m, b, "a", 100.0, ctx=16384, samples=[{"score": 1.0}] * 2)
             for m, b in [("full", "full"), ("snapkv", "m0.125")]]
    assert [h for h, _ in budget_tables(recs)] == ["m — budget m0.125 — 8,192 tokens", "m — budget m0.125 — 16,384 tokens"]
    sixteen = budget_tables(recs)[1][1].splitlines()
    assert [c.strip() for c in sixteen[0].split("|")[2:4]] == ["a@16384", "Avg"]
    assert {l.split("|")[1].strip() for l in sixteen[2:]} == {"full", "snapkv"}  # h2o did not run at 16k
    ((heading, table),) = task_average_tables(recs)
    assert heading == "m — Avg over 2 tasks at 8,192 tokens"
    rows = {l.split("|")[1].strip(): l.split("|")[2].strip() for l in table.splitlines()[2:]}
    assert set(rows) == {"full", "snapkv", "h2o"}
    assert all(cell.startswith("50.0 ± ") for cell in rows.values())  # the 16k cell (100) is not in the mean
    recs += [record(m, b, "b", 0.0, ctx=16384, samples=[{"score": 0.0}] * 2)
             for m, b in [("full", "full"), ("snapkv", "m0.125")]]
    headings = [h for h, _ in task_average_tables(recs)]
    assert headings == ["m — Avg over 2 tasks at 8,192 tokens", "m — Avg over 2 tasks at 16,384 tokens"]
    one_length = [r for r in recs if r.task.context_length == 8192]
    assert [h for h, _ in task_average_tables(one_length)] == ["m — Avg over 2 tasks"]  # no length: one table
    latex = to_latex(recs).split("\\begin{table}")[1:]
    assert [("at 8,192 tokens" in t, "at 16,384 tokens" in t) for t in latex] == [(True, False), (False, True)]
    assert all("-- & full &" in t for t in latex)  # each length's own reference row
    assert [t.get("context_length") for t in json.loads(to_json(recs))["tables"]] == [8192, 16384]
    beside = one_length + [record(m, b, "qasper", 10.0) for m, b in [("full", "full"), ("snapkv", "m0.125")]]
    assert [h for h, _ in budget_tables(beside)] == ["m — budget m0.125"]  # one length beside LongBench: one table
    mixed = recs + [record(m, b, "qasper", 10.0) for m, b in [("full", "full"), ("snapkv", "m0.125")]]
    assert [h for h, _ in budget_tables(mixed)] == ["m — budget m0.125 — 8,192 tokens",
                                                    "m — budget m0.125 — 16,384 tokens", "m — budget m0.125"]


def test_no_average_table_for_a_single_task():
    assert task_average_tables(RECORDS[:1] + [record("snapkv", "128", "qasper", 35.0)]) == []
    assert "Averages over tasks" not in results_markdown({"run_id": "r"}, [RECORDS[0], RECORDS[2]])


def test_a_merged_run_says_what_made_each_of_its_sources():
    def environment(commit, command):
        return {"git_commit": commit, "command": command, "python": "3.11.7", "platform": "Linux", "versions": {}}

    run = {"run_id": "m", "environment": environment("aaa", "pytest one"),
           "merged_from": [{"run_id": "r1", "environment": environment("aaa", "pytest one")},
                           {"run_id": "r2", "environment": environment("bbb", "pytest two --kvbench-sliding compress")}]}
    markdown = results_markdown(run, RECORDS)
    assert "Merged by `kvbench merge` from 2 runs:" in markdown
    assert "- `r1` (commit `aaa`): Made by `pytest one`" in markdown
    assert "- `r2` (commit `bbb`): Made by `pytest two --kvbench-sliding compress`" in markdown
    run["merged_from"][1]["complete"] = False
    run["unfinished"] = [{"item_id": "snapkv-128-trec", "reason": "no record"}]
    markdown = results_markdown(run, RECORDS)
    assert "The run is incomplete. Finish `r2` with its own command and `--kvbench-resume RUN`, then merge again." \
        in markdown and "None" not in markdown
