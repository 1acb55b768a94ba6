"""Reasoning tasks: math-verify extraction and equivalence, the prompt, generation lengths, loading,
and what happens without the optional dependency."""

import json

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench.tasks import DataError, TaskError, available_tasks, get_task, registry
from pytest_kvbench.tasks.reasoning.answer_extraction import extract_answer, strip_reasoning
from pytest_kvbench.tasks.reasoning.verification import is_equivalent
from pytest_kvbench.wiring.grid.command_line import DEFAULT_TASKS, SMOKE_TASKS


class TestEquivalence:
    @pytest.mark.parametrize("prediction, answer, expected", [
        ("so the sum is $\\boxed{\\dfrac{7}{6}}$.", "\\frac{7}{6}", True),  # \dfrac and \frac agree
        ("The answer is \\boxed{7/6}", "\\frac{7}{6}", True),
        ("\\boxed{1.1666}", "\\frac{7}{6}", False),
        ("Thus $x = \\boxed{6}$.", "6", True),
        ("\\boxed{5}", "6", False),
        ("The remainder is \\boxed{267}. Checking with 268 fails.", "267", True),  # the boxed answer wins
        ("I could not solve it.", "24", False),
        ("", "24", False),
        ("$\\boxed{\\frac{1}{2}}$", "0.5", True),
    ])
    def test_is_equivalent(self, prediction, answer, expected):
        assert is_equivalent(prediction, answer) is expected


class TestQwenExtraction:
    """Cases run through QwenLM/Qwen2.5-Math (a45202b) evaluation/parser.py ``extract_answer(text, "math")``
    with its final ``strip_string`` left out (equivalence is math-verify's here); expected = its output."""

    @pytest.mark.parametrize("output, expected", [
        ("First \\boxed{3}, then I recheck: \\boxed{5}.", "5"),  # the last boxed wins
        ("so $\\boxed{\\frac{7}{6}}$.", "\\frac{7}{6}"),  # balanced braces kept
        ("The sum is \\boxed{\\frac{1}{2", "\\frac{1}{2"),  # cut off: the rest of the text
        ("The sum is \\boxed{42", "42"),
        ("Therefore \\boxed 5$ is it.", "5"),  # no brace: up to the next $
        ("ends with boxed", ""),
        ("The final answer is $7$. I hope it is correct.", "7"),  # Minerva's format
        ("So the answer is 24.", "24"),
        ("The final answer is: 12.", " 12"),  # one leading ':' and one trailing '.' dropped
        ("I get 3, then 1,024 apples.", "1024"),  # the last number, commas dropped
        ("I could not solve it.", ""),
        ("", ""),
        ("Answer:\n  \\boxed{\n 12\n}", "12"),  # line breaks and the indentation after them go
    ])
    def test_extract_answer(self, output, expected):
        assert extract_answer(output) == expected


class TestReasoningBlock:
    @pytest.mark.parametrize("output, expected", [
        ("<think>maybe \\boxed{3}</think>So \\boxed{5}.", "So \\boxed{5}."),
        ("maybe \\boxed{3}\n</think>\n\nSo \\boxed{5}.", "\n\nSo \\boxed{5}."),  # the template opened <think>
        ("<think>a</think><think>b</think>c", "c"),
        ("no reasoning block, \\boxed{5}", "no reasoning block, \\boxed{5}"),
        ("<think>cut off before closing, \\boxed{5}", "<think>cut off before closing, \\boxed{5}"),
    ])
    def test_the_answer_is_after_the_last_closing_tag(self, output, expected):
        assert strip_reasoning(output) == expected

    @pytest.mark.parametrize("prediction, answer, expected", [
        ("<think>Try \\boxed{3}. No, wrong.</think>The answer is \\boxed{5}.", "5", True),
        ("<think>Try \\boxed{5}.</think>The answer is \\boxed{3}.", "5", False),  # thinking never counts
        ("Try 5.\n</think>\n\n$\\boxed{\\dfrac{1}{2}}$", "0.5", True),  # closed only
        ("\\boxed{3} at first, finally \\boxed{6}", "6", True),  # the last boxed, not the set of them
        ("\\boxed{6} at first, finally \\boxed{3}", "6", False),
        ("The total is \\boxed{267", "267", True),  # cut off inside the box
    ])
    def test_scoring(self, prediction, answer, expected):
        assert is_equivalent(prediction, answer) is expected


def test_tasks_and_the_reference_generation_length():
    assert available_tasks("reasoning") == ["math500", "aime2024", "aime2025"]
    assert {get_task(name).max_new_tokens for name in available_tasks("reasoning")} == {32768}


class TestGenerationLengthOverride:
    def test_a_name_sets_the_length_and_keeps_its_spelling(self):
        task = get_task("math500:max_new_tokens=4096")
        assert task.max_new_tokens == 4096 and task.name == "math500:max_new_tokens=4096"
        assert task.suite == "reasoning" and get_task("math500").max_new_tokens == 32768

    @pytest.mark.parametrize("name, message", [
        ("math500:max_new_tokens=0", "must be a positive integer"),
        ("math500:max_new_tokens=many", "must be a positive integer"),
        ("math500:temperature=1", "unknown setting 'temperature=1'"),
        ("math5000:max_new_tokens=10", "unknown task 'math5000'"),
    ])
    def test_bad_settings_are_task_errors(self, name, message):
        with pytest.raises(TaskError, match=message):
            get_task(name)


def test_prompt_is_the_problem_then_the_instruction_in_the_chat_template():
    tokenizer = tiny_tokenizer(chat_template=True)
    task = get_task("aime2024")
    sample = task.load_samples(None, data_dir="fixtures")[0]
    assert task.prompt_text(sample) == (
        "Find the remainder when $2^{10} + 3^{5}$ is divided by $1000$.\n"
        "Please reason step by step, and put your final answer within \\boxed{}."
    )
    prompt = task.build_prompt(sample, tokenizer, 10)  # never truncated
    text = tokenizer.decode(prompt.input_ids)
    assert text.startswith("<s>[user] Find the remainder") and text.endswith("<s>[assistant] ")
    assert tokenizer.decode(prompt.input_ids[prompt.context_len:]).startswith("Please reason")


class TestLoading:
    def test_fixtures_of_each_task_verify_against_their_solutions(self):
        for name in available_tasks("reasoning"):
            task = get_task(name)
            samples = task.load_samples(None, data_dir="fixtures")
            assert samples and all(task.score(s.fields["solution"], s) == 1.0 for s in samples)
        ids = [s.id for s in get_task("math500").load_samples(None, data_dir="fixtures")]
        assert ids == ["math500:fixture/prealgebra/1.json", "math500:fixture/algebra/2.json"]

    def test_an_unparsable_reference_is_a_data_error(self, tmp_path):
        lines = [{"problem": "1+1?", "answer": "2"}, {"problem": "What?", "answer": ""}]
        (tmp_path / "aime2025.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
        with pytest.raises(DataError, match=r"aime2025\.jsonl:2: math-verify cannot parse the reference answer ''"):
            get_task("aime2025").load_samples(None, data_dir=str(tmp_path))

    def test_a_missing_problem_is_a_data_error(self, tmp_path):
        (tmp_path / "reasoning").mkdir()
        (tmp_path / "reasoning" / "math500.jsonl").write_text('{"answer": "2"}\n', encoding="utf-8")
        with pytest.raises(DataError, match=r"math500\.jsonl:1: missing field 'problem'"):
            get_task("math500").load_samples(None, data_dir=str(tmp_path))


class TestWithoutMathVerify:
    @pytest.fixture
    def no_math_verify(self, monkeypatch):
        real = registry.importlib.util.find_spec
        monkeypatch.setattr(registry.importlib.util, "find_spec",
                            lambda name, *a: None if name == "math_verify" else real(name, *a))

    def test_naming_a_task_says_which_extra_to_install(self, no_math_verify):
        with pytest.raises(TaskError, match=r"task 'math500': the reasoning tasks need math-verify: "
                                            r"pip install 'pytest-kvbench\[reasoning\]'"):
            get_task("math500:max_new_tokens=64")

    def test_the_default_grid_leaves_the_suite_out(self, no_math_verify):
        assert not [t for t in registry.runnable(DEFAULT_TASKS) if t.startswith("aime")]
        assert "passkey" in registry.runnable(SMOKE_TASKS)

    def test_collection_stops_with_a_usage_error(self, no_math_verify, pytester):
        from helpers import add_bench_files

        add_bench_files(pytester)
        result = pytester.runpytest("--collect-only", "-q", "--kvbench-tasks", "aime2024", "-p", "no:cacheprovider")
        assert result.ret == 4
        result.stderr.fnmatch_lines(["*the reasoning tasks need math-verify: pip install 'pytest-kvbench[[]reasoning[]]'*"])
