"""One item's generations under a group protocol (the runner dispatches: runner._run).

question_in_window and query_agnostic run one prompt per sample in the runner, compared against the
full-cache reference for fidelity, their prefills shared by the reference group. shared_context and multi_turn (kvmethods/protocols/) run a group of samples
that share a context at once: the samples whose prompts start with the same context tokens, in turn
order (SCBench's ``turn`` field, else file order). There, fidelity is not measured (no single-prompt
reference to teacher-force against): kl and agreement are None.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple


GROUP_RUNNERS = {"shared_context": "answer_questions", "multi_turn": "run_turns"}


class Generation(NamedTuple):
    sample: object
    result: object  # kvmethods.generation.GenerationOutput
    kl: float | None
    agreement: float | None
    context: int | None = None  # index of the sample's context group (group protocols)
    turn: int | None = None  # position of the question in its group (group protocols)


def context_groups(samples: list, prompts: list) -> list[list[int]]:
    """Indices of the samples that share a context (the prompt tokens before context_len), groups in
    order of first appearance, each in turn order."""
    groups: dict[tuple, list[int]] = {}
    for index, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt.input_ids[: prompt.context_len]), []).append(index)
    return [sorted(group, key=lambda i: (samples[i].fields.get("turn", 0), i)) for group in groups.values()]


def generations(runner, case, task, method, budget, loaded, samples: list) -> Iterator[Generation]:
    """Every sample's generation under a group protocol (shared_context, multi_turn), group by group;
    one-prompt protocols run in the runner (runner._single_prompts), where prefills are shared."""
    from kvmethods import protocols

    prompts = [runner._prompt(case, task, sample, loaded) for sample in samples]
    run_group = getattr(protocols, GROUP_RUNNERS[case.protocol])
    for context_index, group in enumerate(context_groups(samples, prompts)):
        first = prompts[group[0]]
        questions = [prompts[i].input_ids[prompts[i].context_len:] for i in group]
        results = run_group(loaded.model, method, budget, first.input_ids[: first.context_len], questions,
                            task.max_new_tokens, loaded.eos_token_ids)
        for turn, (index, result) in enumerate(zip(group, results)):
            yield Generation(samples[index], result, None, None, context_index, turn)


def group_position(context: int | None, turn: int | None) -> dict:
    """A sample row's place in its context group: {"context": i, "turn": k}, or nothing outside groups."""
    return {} if context is None else {"context": context, "turn": turn}


def by_context_and_turn(rows: list[dict]) -> dict:
    """Scores per context and per turn (100 x mean, like a task's score) of a grouped item's rows;
    {"contexts": {"0": ..}, "turns": {"1": ..}} with turns counted from 1; empty outside groups."""
    grouped = [row for row in rows if "context" in row]
    if not grouped:
        return {}

    def mean_by(field: str, offset: int) -> dict[str, float]:
        scores: dict[str, list[float]] = {}
        for row in grouped:
            scores.setdefault(str(row[field] + offset), []).append(row["score"])
        return {key: round(100.0 * sum(values) / len(values), 2) for key, values in scores.items()}

    return {"contexts": mean_by("context", 0), "turns": mean_by("turn", 1)}
