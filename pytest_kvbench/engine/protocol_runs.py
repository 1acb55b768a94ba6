"""One item's generations under a group protocol: the runner dispatches here (runner._run) with the
samples' prompts and its reference cache; nothing here reaches back into the runner.

question_in_window and query_agnostic run one prompt per sample in the runner, compared against the
full-cache reference for fidelity, their prefills shared by the reference group. shared_context and
multi_turn (kvmethods/runtime/protocols/) run a group of samples that share a context at once: the samples whose
prompts start with the same context tokens, in turn order (SCBench's ``turn`` field, else file order).
Under multi_turn each turn feeds its prompt from ``Prompt.turn_start``; a task with gold history
(``Task.turn_history``, SCBench's default) has the reference answers in those tokens and its model answers
are dropped after each turn.

Fidelity there: the reference is `full` under the same protocol and question order, run once per group
and cached per worker like the one-prompt references; every method is teacher-forced on the reference's
answer to each question (shared_context: on a copy of that question's cache; multi_turn: in a session
whose history holds the reference's own questions and answers), so kl and agreement mean what they mean
under the default protocol.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from kvmethods import FULL_CACHE, get_method
from kvmethods.runtime import protocols
from pytest_kvbench.engine.fidelity import ReferenceCache, compare, reference_of
from pytest_kvbench.engine.finite_logits import check_logits_finite

GROUP_RUNNERS = {"shared_context": "answer_questions", "multi_turn": "run_turns"}


class Generation(NamedTuple):
    sample: object
    result: object  # kvmethods.runtime.generation.GenerationOutput
    kl: float | None
    agreement: float | None
    context: int | None = None  # index of the sample's context group (group protocols)
    turn: int | None = None  # position of the question in its group (group protocols)
    decode_kl: float | None = None  # KL along the greedy decode (fidelity.py); not measured under group protocols


def context_groups(samples: list, prompts: list) -> list[list[int]]:
    """Indices of the samples that share a context (the prompt tokens before context_len), groups in
    order of first appearance, each in turn order."""
    groups: dict[tuple, list[int]] = {}
    for index, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt.input_ids[: prompt.context_len]), []).append(index)
    return [sorted(group, key=lambda i: (samples[i].fields.get("turn", 0), i)) for group in groups.values()]


def generations(case, task, method, budget, loaded, samples: list, prompts: list,
                references: ReferenceCache) -> Iterator[Generation]:
    """Every sample's generation under a group protocol (shared_context, multi_turn), group by group,
    with its kl and agreement against the group's full-cache reference (made once per worker in
    `references`); the runner gives the samples' prompts and dispatches here. One-prompt protocols run in
    the runner (Runner._single_prompts), where prefills are shared."""
    run_group = getattr(protocols, GROUP_RUNNERS[case.protocol])
    settings = {"keep_answers": task.turn_history != "gold"} if case.protocol == "multi_turn" else {}
    for context_index, group in enumerate(context_groups(samples, prompts)):
        first = prompts[group[0]]
        context = first.input_ids[: first.context_len]
        if case.protocol == "multi_turn":
            questions = turn_tokens([prompts[i] for i in group], task.turn_history == "gold")
        else:
            questions = [prompts[i].input_ids[prompts[i].context_len:] for i in group]

        def full_cache_reference():
            outs = run_group(loaded.model, get_method(FULL_CACHE.spec), FULL_CACHE, context, questions,
                             task.max_new_tokens, loaded.eos_token_ids, return_logprobs=True, **settings)
            return [reference_of(out, f"full-cache reference of {case.task} sample {samples[i].id}")
                    for i, out in zip(group, outs)]

        key = (case.model, case.task, case.seed, case.context_length, tuple(samples[i].id for i in group),
               case.protocol)
        group_references = references.get(key, full_cache_reference)
        if case.is_reference:
            for turn, (index, reference) in enumerate(zip(group, group_references)):
                yield Generation(samples[index], reference.result, 0.0, 1.0, context_index, turn, 0.0)
            continue
        results = run_group(loaded.model, method, budget, context, questions, task.max_new_tokens,
                            loaded.eos_token_ids, teacher_targets=[r.target_ids for r in group_references], **settings)
        for turn, (index, result, reference) in enumerate(zip(group, results, group_references)):
            check_logits_finite(result.target_logprobs, f"{case.id} sample {samples[index].id}")
            yield Generation(samples[index], result, *compare(reference, result.target_logprobs), context_index, turn)


def turn_tokens(prompts: list, gold_history: bool) -> list[list[int]]:
    """What each turn of a conversation feeds on top of the one before: its tokens from ``turn_start``
    (the first turn: from the context's end). With gold history each turn's prompt must continue the one
    before it token for token, since the conversation is one cache; a gap would silently drop history."""
    turns = []
    for index, prompt in enumerate(prompts):
        start = prompt.context_len if index == 0 or prompt.turn_start is None else prompt.turn_start
        if gold_history and index and prompt.input_ids[:start] != prompts[index - 1].input_ids:
            raise ValueError(f"turn {index + 1}'s prompt does not continue turn {index}'s: the task's samples "
                             "of one conversation must be its consecutive turns")
        turns.append(prompt.input_ids[start:])
    return turns


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
