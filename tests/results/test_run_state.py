"""`kvbench` read commands say what they found (issue 31, item 3): complete, incomplete (which items),
or damaged with what was wrong and where the records were recovered from; a damaged run exits 2, and
every path a command will write is checked before it reads or prints anything."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from test_cli_support import RUN_ID, make_record, run_cli, standard_records, write_run

from pytest_kvbench.results.run import storage
from pytest_kvbench.cases import GridError
from pytest_kvbench.results.run.directories import RunError, load_run

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

SEEDS = (0, 1, 2)  # variance needs several seeds of one item
COMMANDS = {  # command -> its arguments for one run (RUN_ID)
    "show": ["show", RUN_ID],
    "env": ["env", RUN_ID],
    "export": ["export", RUN_ID, "--format", "csv"],
    "compare": ["compare", RUN_ID, RUN_ID],
    "report": ["report", RUN_ID, "-o", "{tmp}/report.html"],
    "variance": ["variance", RUN_ID, "--plot", "none"],
}


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path, standard_records(seeds=SEEDS))


def cli(capsys, tmp_path, *argv):
    return run_cli(capsys, *[str(a).replace("{tmp}", str(tmp_path)) for a in argv], "--results", tmp_path)


def truncate_run_json(run_dir):
    text = (run_dir / storage.RUN_FILE).read_text()
    (run_dir / storage.RUN_FILE).write_text(text[: len(text) // 2])  # a full disk cut it


def garbage_after_records(run_dir):
    with open(run_dir / storage.RECORDS_FILE, "a") as handle:
        handle.write("\x00\x00 garbage\n")


DAMAGE = {  # how a run was damaged -> what the one line must name
    "run.json truncated": (truncate_run_json, ["run.json: invalid JSON", "recovered from records.jsonl"]),
    "records.jsonl ends in garbage": (garbage_after_records, ["records.jsonl:31: not a JSON record"]),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_run_is_read_as_far_as_it_goes_and_exits_2_naming_what_was_wrong(capsys, tmp_path, run_dir,
                                                                                    command, damage):
    spoil, named = DAMAGE[damage]
    spoil(run_dir)
    code, out, err = cli(capsys, tmp_path, *COMMANDS[command])
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"kvbench {command}: error: run {RUN_ID} is damaged (")
    for fragment in named:
        assert fragment in lines[0], lines[0]
    if command in ("show", "export", "variance"):
        assert "qasper" in out  # the recovered records are shown: nothing finished is lost


def test_show_names_the_damage_in_its_heading(capsys, tmp_path, run_dir):
    truncate_run_json(run_dir)
    code, out, _ = cli(capsys, tmp_path, "show", RUN_ID)
    heading = out.splitlines()[0]
    assert code == 2 and heading.startswith(f"run {RUN_ID} (damaged (") and "(complete)" not in out
    assert "its records were recovered from records.jsonl" in heading
    assert len(load_run(RUN_ID, tmp_path).records) == 30


def test_records_that_only_run_json_still_holds_are_recovered_and_named(capsys, tmp_path, run_dir):
    log = run_dir / storage.RECORDS_FILE
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:20]))  # the last 10 lines lost
    run = load_run(RUN_ID, tmp_path)
    assert len(run.records) == 30 and run.state.damaged
    assert "records.jsonl lacks 10 record(s) that run.json holds" in run.state.label()
    assert run.state.source == "records.jsonl and run.json"
    code, _, err = cli(capsys, tmp_path, "show", RUN_ID)
    assert code == 2 and "lacks 10 record(s)" in err


def test_an_incomplete_run_names_its_missing_items_and_exits_0(capsys, tmp_path, run_dir):
    info = json.loads((run_dir / storage.RUN_FILE).read_text())
    info |= {"complete": False, "unfinished": [{"item_id": "snapkv-128-qasper-seed2", "reason": "crashed"}],
             "resume_command": f"pytest bench/ --kvbench-resume {RUN_ID}"}
    (run_dir / storage.RUN_FILE).write_text(json.dumps(info))
    code, out, err = cli(capsys, tmp_path, "show", RUN_ID)
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"run {RUN_ID} (incomplete: 1 item(s) not finished (snapkv-128-qasper-seed2))"


def test_a_run_without_run_json_is_incomplete_not_damaged(capsys, tmp_path, run_dir):
    (run_dir / storage.RUN_FILE).unlink()
    code, out, _ = cli(capsys, tmp_path, "show", RUN_ID)
    assert code == 0
    assert out.splitlines()[0] == f"run {RUN_ID} (incomplete: no run.json (the run is still going, or was " \
                                  f"stopped before its end))"


def session(tmp_path, *, is_controller: bool):
    from kvmethods import Budget
    from pytest_kvbench.cases import Grid, MethodSpec
    from pytest_kvbench.wiring.session import RunSession

    grid = Grid(methods=[MethodSpec("snapkv")], budgets=[Budget.parse("128")], tasks=["qasper"])
    return RunSession(grid, tmp_path, RUN_ID, is_controller=is_controller, environment={"command": "pytest bench/"})


def test_a_record_appended_after_another_process_s_crash_record_supersedes_it(capsys, tmp_path):
    """An xdist controller appends a crash record when a worker dies; ``--dist loadgroup`` runs the item again
    in the same session on another worker, started before the crash: its record still says what it
    supersedes, and the run is complete with 1 crashed item, named in every command."""
    worker, controller = session(tmp_path, is_controller=False), session(tmp_path, is_controller=True)
    first, second = standard_records()[:2]
    worker.add(first)
    controller.add(second | {"status": "error", "crashed": True, "message": "worker gw1 crashed", "score": None})
    worker.add(second)
    lines = storage.read_records(tmp_path / "runs" / RUN_ID / storage.RECORDS_FILE)
    assert "supersedes" not in lines[0] and "supersedes" not in lines[1]
    assert lines[2]["supersedes"] == {"status": "error", "message": "worker gw1 crashed", "crashed": True}
    controller.finish(complete=True)
    run = load_run(RUN_ID, tmp_path)
    assert run.state.label() == f"complete with 1 crashed item ({second['item_id']}: re-run)" and run.complete
    assert [c["item_id"] for c in run.info["crashed"]] == [second["item_id"]]
    code, out, _ = cli(capsys, tmp_path, "show", RUN_ID)
    assert f"crashed, then run again: {second['item_id']}: worker gw1 crashed" in out
    assert "Items whose worker crashed, then run again" in (tmp_path / "runs" / RUN_ID / "RESULTS.md").read_text()


def test_a_run_that_wrote_its_start_and_was_killed_names_every_item_it_did_not_finish(capsys, tmp_path):
    run = session(tmp_path, is_controller=True)
    cases = [(SimpleNamespace(key=r["key"]), r["item_id"], f"t.py::t[{r['item_id']}]") for r in standard_records()[:3]]
    run.expect(cases)
    run.write_start()
    run.add(standard_records()[0])  # then kill -9: no end
    info = json.loads((tmp_path / "runs" / RUN_ID / storage.RUN_FILE).read_text())
    assert info["end"] is None and info["environment"]["command"] == "pytest bench/" and len(info["expected"]) == 3
    missing = ", ".join(r["item_id"] for r in standard_records()[1:3])
    assert load_run(RUN_ID, tmp_path).state.label() == \
        f"incomplete: stopped before its end (killed, or still running); 2 item(s) not finished ({missing})"
    assert (tmp_path / "runs" / RUN_ID / storage.SETTINGS_FILE).is_file(), "so that it can be resumed"


def test_a_lock_only_folder_is_listed_resumable_and_cleanable(capsys, tmp_path):
    from pytest_kvbench.results.run.lock import RunLock
    from pytest_kvbench.wiring.grid.resume import check_resume

    folder = tmp_path / "runs" / RUN_ID
    RunLock(folder).acquire().release()
    code, out, _ = cli(capsys, tmp_path, "list")
    assert code == 0 and RUN_ID in out and "started, no item finished" in out
    assert check_resume(RUN_ID, tmp_path, session(tmp_path, is_controller=True).grid) == RUN_ID
    holder = RunLock(folder).acquire()
    try:
        with pytest.raises(GridError, match=f"run {RUN_ID} is in use by process {os.getpid()} on "):
            check_resume(RUN_ID, tmp_path, session(tmp_path, is_controller=True).grid)
    finally:
        holder.release()
    write_run(tmp_path, standard_records()[:1], run_id="bench_9f8e7d6c_20250103_101010")
    code, _, err = cli(capsys, tmp_path, "clean", "bench_9f8e7d6c_20250103_101010")
    assert code == 2 and "holds 1 record(s); clean removes only a run with no finished item" in err
    code, out, _ = cli(capsys, tmp_path, "clean", RUN_ID)
    assert code == 0 and not folder.exists() and "started, no item finished" in out


def test_a_damaged_run_is_repaired_in_one_line_before_a_resume_runs(tmp_path, run_dir):
    from pytest_kvbench.results.run.repair import repair

    garbage_after_records(run_dir)
    truncate_run_json(run_dir)
    line = repair(run_dir)
    assert line.startswith(f"kvbench: --kvbench-resume {RUN_ID} found the run damaged and repaired it before running: ")
    assert "1 line(s) of records.jsonl that are not records (line 31) moved to records.jsonl.damaged" in line
    assert "run.json could not be read: kept as run.json.damaged" in line and "\n" not in line
    assert (run_dir / "records.jsonl.damaged").read_text() == "\x00\x00 garbage\n"
    run = load_run(RUN_ID, tmp_path)
    assert not run.state.damaged and len(run.records) == 30
    assert repair(run_dir) is None


def test_records_only_run_json_holds_are_put_back_by_the_repair(tmp_path, run_dir):
    from pytest_kvbench.results.run.repair import repair

    log = run_dir / storage.RECORDS_FILE
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:20]))
    assert "10 record(s) that only run.json held appended to records.jsonl" in repair(run_dir)
    assert len(storage.read_records(log)) == 30 and not load_run(RUN_ID, tmp_path).state.damaged


def test_the_results_directory_s_table_says_which_run_it_shows_and_where_the_others_are(tmp_path):
    from pytest_kvbench.wiring.session import RunSession

    first = session(tmp_path, is_controller=True)
    first.add(standard_records()[0])
    first.finish(complete=True)
    alone = (tmp_path / "RESULTS.md").read_text()
    assert alone == (tmp_path / "runs" / RUN_ID / "RESULTS.md").read_text() and "other run" not in alone
    later = "bench_9f8e7d6c_20250103_101010"
    second = RunSession(first.grid, tmp_path, later, is_controller=True, environment={"command": "pytest bench/"})
    second.add(standard_records(run_id=later)[1])
    second.finish(complete=True)
    shared = (tmp_path / "RESULTS.md").read_text()
    assert f"This file shows the last run written here, `{later}`, only. 1 other run(s) share this results " \
           f"directory (`{RUN_ID}`)" in shared
    assert f"kvbench list --results {tmp_path}" in shared and "runs/<run id>/RESULTS.md" in shared
    assert "other run" not in (tmp_path / "runs" / later / "RESULTS.md").read_text()


def test_a_torn_last_line_of_a_killed_writer_is_named_but_is_no_damage(capsys, tmp_path, run_dir):
    with open(run_dir / storage.RECORDS_FILE, "a") as handle:
        handle.write('{"run_id": "bench_0a1b2c3d_20250102_030405", "key": "half')
    code, out, _ = cli(capsys, tmp_path, "show", RUN_ID)
    assert code == 0
    assert "(complete (records.jsonl line 31: torn by a killed writer, skipped))" in out.splitlines()[0]


def test_a_run_with_nothing_to_recover_is_one_error(capsys, tmp_path, run_dir):
    truncate_run_json(run_dir)
    (run_dir / storage.RECORDS_FILE).write_text("garbage\n")
    with pytest.raises(RunError, match="run.json: invalid JSON"):
        load_run(RUN_ID, tmp_path)
    code, out, err = cli(capsys, tmp_path, "show", RUN_ID)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_list_says_which_runs_are_damaged(capsys, tmp_path, run_dir):
    garbage_after_records(run_dir)
    code, out, _ = cli(capsys, tmp_path, "list")
    assert code == 0 and "damaged (" in out and "records.jsonl:31" in out
    listed = json.loads(cli(capsys, tmp_path, "list", "--json")[1])
    assert listed[0]["complete"] is False and listed[0]["state"].startswith("damaged (")


def test_merge_refuses_a_damaged_run(capsys, tmp_path, run_dir):
    other = write_run(tmp_path, [make_record(method="tova", params={}, task="qasper")],
                      run_id="bench_9f8e7d6c_20250103_101010")
    truncate_run_json(other)
    code, out, err = cli(capsys, tmp_path, "merge", RUN_ID, other.name)
    assert code == 2 and "bench_9f8e7d6c_20250103_101010 is damaged" in err and "merge takes intact runs" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted([RUN_ID, other.name])


# -- outputs checked before anything is read or printed ---------------------------------------------------


@pytest.mark.parametrize("argv, named", [
    (["variance", RUN_ID, "--plot", "{tmp}/a_file/plot.png"], "--plot"),
    (["variance", RUN_ID, "--plot", "{tmp}/plot.gif"], "use a .png, .svg or .pdf"),
    (["export", RUN_ID, "--format", "md", "-o", "{tmp}/a_file/table.md"], "--output"),
    (["export", RUN_ID, "--format", "md", "-o", "{tmp}/runs"], "is a directory, not a file"),
    (["export", RUN_ID, "--format", "kvpress", "-o", "{tmp}/a_file"], "is a file, not a directory"),
    (["report", RUN_ID, "-o", "{tmp}/runs"], "is a directory, not a file"),
    (["report", RUN_ID, "-o", "{tmp}/a_file/r.html"], "a parent of it is a file"),
    (["merge", RUN_ID, RUN_ID, "--into", "{tmp}/a_file"], "is a file, not a directory"),
])
def test_an_output_that_cannot_be_written_is_refused_before_anything_is_printed(capsys, tmp_path, run_dir,
                                                                               argv, named):
    (tmp_path / "a_file").write_text("keep me\n")
    code, out, err = cli(capsys, tmp_path, *argv)
    assert code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert (tmp_path / "a_file").read_text() == "keep me\n"


def test_the_report_names_each_runs_state(capsys, tmp_path, run_dir):
    garbage_after_records(run_dir)
    code, _, _ = cli(capsys, tmp_path, "report", RUN_ID, "-o", tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert code == 2
    assert "damaged (" in page and "records.jsonl:31: not a JSON record" in page
