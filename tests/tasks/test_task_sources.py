"""Where records come from (shared by the suites): JSON arrays with line numbers, the
DIR/<suite>/ layout, the fixture folder, and collection of every new suite with readable ids."""

import pytest
from helpers import add_bench_files

from pytest_kvbench.tasks import DataError, TaskUnavailable, available_tasks
from pytest_kvbench.tasks.sources import DATA_ROOT, is_fixture_dir, local_file, read_json_array


def keep(record, where):
    return record


class TestJsonArray:
    def test_each_record_is_placed_on_the_line_it_starts(self, tmp_path):
        path = tmp_path / "data.json"
        path.write_text('[\n {"a": 1},\n\n {"a": 2,\n  "b": 3}\n]\n', encoding="utf-8")
        assert [where for where, _ in read_json_array(path, keep)] == [f"{path}:2", f"{path}:4"]

    @pytest.mark.parametrize("text, message", [
        ('{"a": 1}', r":1: expected a JSON array of records"),
        ('[\n {"a": 1}\n {"a": 2}\n]', r":3: expected ',' or '\]' between records"),
        ('[\n {"a": 1},\n {"a": }\n]', r":3: not valid JSON"),
    ])
    def test_malformed_files_name_the_line(self, tmp_path, text, message):
        path = tmp_path / "data.json"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataError, match=message):
            list(read_json_array(path, keep))

    def test_an_empty_array_has_no_records(self, tmp_path):
        path = tmp_path / "data.json"
        path.write_text(" [ ] ", encoding="utf-8")
        assert list(read_json_array(path, keep)) == []


class TestLocations:
    def test_the_suite_folder_comes_before_the_top_level(self, tmp_path):
        (tmp_path / "scbench").mkdir()
        for path in (tmp_path / "scbench" / "f.jsonl", tmp_path / "f.jsonl"):
            path.write_text("", encoding="utf-8")
        assert local_file(tmp_path, "scbench", "f.jsonl", "hint") == tmp_path / "scbench" / "f.jsonl"
        (tmp_path / "scbench" / "f.jsonl").unlink()
        assert local_file(tmp_path, "scbench", "f.jsonl", "hint") == tmp_path / "f.jsonl"

    def test_a_missing_file_names_both_places(self, tmp_path):
        with pytest.raises(TaskUnavailable, match=r"neither .*scbench/f\.jsonl nor .*/f\.jsonl exists; hint"):
            local_file(tmp_path, "scbench", "f.jsonl", "hint")

    def test_fixture_folders(self, tmp_path):
        assert is_fixture_dir("fixtures") and is_fixture_dir(DATA_ROOT / "longbench") and is_fixture_dir(DATA_ROOT)
        assert not is_fixture_dir(tmp_path) and not is_fixture_dir(None)


NEW_SUITES = ("longbench_v2", "infinitebench", "reasoning", "scbench")


def test_every_new_task_collects_with_a_readable_id(pytester):
    add_bench_files(pytester)
    names = [name for suite in NEW_SUITES for name in available_tasks(suite)]
    result = pytester.runpytest("--collect-only", "-q", "--kvbench-tasks", ",".join(names),
                                "--kvbench-methods", "full,snapkv", "--kvbench-budgets", "64", "-p", "no:cacheprovider")
    assert result.ret == 0
    ids = {line.split("[", 1)[1].rstrip("]") for line in result.outlines if "::test_" in line}
    assert ids == {f"{prefix}-{name}" for name in names for prefix in ("full", "snapkv-64")}


def test_smoke_selects_one_fixture_task_per_suite(pytester):
    add_bench_files(pytester)
    result = pytester.runpytest("--collect-only", "-q", "-m", "smoke", "--kvbench-methods", "full",
                                "-p", "no:cacheprovider")
    files = {line.split("::")[0] for line in result.outlines if "::test_" in line}
    assert files == {f"test_suite_{suite}.py" for suite in ("longbench", "ruler") + NEW_SUITES}


class TestKvbenchTasks:
    def test_lists_every_task_with_its_metric(self, capsys):
        import json

        from pytest_kvbench.cli import main

        assert main(["tasks", "--json"]) == 0
        rows = {row["task"]: row for row in json.loads(capsys.readouterr().out)}
        assert set(rows) == set(available_tasks())
        assert rows["longbook_sum_eng"]["metric"] == "rouge_lsum" and rows["math_calc"]["max_new_tokens"] == 30000
        assert rows["aime2025"]["source"] == "yentinglin/aime_2025" and rows["aime2025"]["missing"] is None

    def test_one_suite_as_a_table_and_a_bad_suite_exits_2(self, capsys):
        from pytest_kvbench.cli import main

        assert main(["tasks", "--suite", "scbench"]) == 0
        out = capsys.readouterr().out
        assert "scbench_prefix_suffix" in out and "substring_match" in out and "passkey" not in out
        assert main(["tasks", "--suite", "babilong"]) == 2
        assert "unknown suite 'babilong'" in capsys.readouterr().err


def test_hub_loading_goes_through_datasets_with_each_suites_arguments(monkeypatch):
    """The hub path (never downloaded in tests): the load_dataset arguments of every suite, rows
    validated like file records and placed as hub:<dataset>:<row>."""
    import datasets

    from pytest_kvbench.tasks import get_task

    calls = []
    rows = {
        "THUDM/LongBench-v2": {"_id": "h1", "domain": "d", "sub_domain": "s", "difficulty": "easy", "length": "short",
                               "question": "q", "choice_A": "a", "choice_B": "b", "choice_C": "c", "choice_D": "d",
                               "answer": "A", "context": "ctx"},
        "xinrongzhang2022/InfiniteBench": {"id": 7, "context": "c", "input": "q", "answer": ["42"], "options": []},
        "HuggingFaceH4/aime_2024": {"id": 3, "problem": "p", "answer": "5"},
        "microsoft/SCBench": {"id": 2, "context": "c", "multi_turns": [{"input": "q", "answer": "v"}]},
    }

    def fake_load_dataset(**kwargs):
        calls.append(kwargs)
        return [rows[kwargs["path"]]]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    loaded = {name: get_task(name).load_samples(None) for name in ("longbench_v2", "passkey", "aime2024", "scbench_kv")}
    assert calls == [
        {"path": "THUDM/LongBench-v2", "split": "train"},
        {"path": "xinrongzhang2022/InfiniteBench", "data_files": "passkey.jsonl", "split": "train"},
        {"path": "HuggingFaceH4/aime_2024", "split": "train"},
        {"path": "microsoft/SCBench", "name": "scbench_kv", "split": "test"},
    ]
    assert [s.id for samples in loaded.values() for s in samples] == ["h1", "passkey:7", "aime2024:3", "scbench_kv:2:0"]
    assert loaded["passkey"][0].fields["source"] == "hub:xinrongzhang2022/InfiniteBench/passkey.jsonl:0"


def test_hub_failure_is_unavailable_with_how_to_get_the_files(monkeypatch):
    import datasets

    from pytest_kvbench.tasks import get_task

    def offline(**kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TaskUnavailable, match=r"datasets could not load microsoft/SCBench/scbench_vt "
                                              r"\(ConnectionError: offline\); download data/scbench_vt\.jsonl"):
        get_task("scbench_vt").load_samples(None)
