"""SCBench's multi-turn conversation as token ids: the first turn chat-templated then truncated, later
turns appended, each holding the previous turn's gold answer (or not: the model's own history).

microsoft/MInference (commit fb56c91), scbench/:

* eval_utils.py ``create_multiturn_prompt``: the first turn is ``multiturn_templates`` filled with the
  context and the first question, as the user turn of the chat template with the generation prompt.
  A later turn k, with gold history (the default; ``--disable_golden_context`` off), is the chat
  template of ``[system "", assistant <answer of turn k-1>, user <follow-up k>]`` with the generation
  prompt, from which the rendering of ``[system ""]`` with the generation prompt is removed
  (``str.replace``): the gold answer closes the previous assistant turn, and the next user turn follows.
  With the model's own history, it is ``[user <follow-up k>]`` less the rendering of ``[system ""]``
  without the generation prompt. Without a chat template, the follow-up with gold history is
  ``multiturn_follow_up_templates`` (``{pre_ans}`` first). Answers are inserted as ``str(answer)``
  (scbench_vt's list of values reads as a Python list).
* run_scbench.py ``get_pred``/``truncate_input``: the templated first turn is tokenized and, when longer
  than ``max_seq_length - max_new_tokens * turns``, cut to its first and last ``limit // 2`` tokens;
  later turns are never truncated. Each later turn is tokenized alone without special tokens
  (``GreedySearch._process_texts``) and prefilled on top of the conversation's cache.

Here ``max_seq_length - max_new_tokens`` is the runner's ``max_prompt_tokens``, so the first turn's
limit is ``max_prompt_tokens - (turns - 1) * max_new_tokens``, with ``turns`` the context's own number
of turns (the official script takes the first record's, capped by ``--max_turns``; SCBench's records
of one task all have the same). The first turn is tokenized without special tokens under the chat
template, which writes its own BOS (the official ``tok.encode`` adds a second one for Llama models).
"""

from __future__ import annotations

from ..base import Prompt
from ..errors import TaskError
from ..prompting import encode, has_chat_template, locate_question, render_chat, tokenize_with_boundary


def turn_values(turn: dict, context: str | None = None) -> dict:
    values = {"input": turn["input"]}
    for letter, option in zip("ABCD", turn.get("options") or ()):
        values[f"OPTION_{letter}"] = option
    return values if context is None else values | {"context": context}


def truncate_tokens(prompt: Prompt, limit: int | None) -> Prompt:
    """run_scbench.py truncate_input: the first and last ``limit // 2`` tokens; the context boundary moves
    with the cut (to the cut itself when the question loses its start)."""
    ids = prompt.input_ids
    if limit is None or len(ids) <= limit:
        return prompt
    if limit < 2:
        raise TaskError(f"no room for the first turn ({limit} tokens left after every turn's generation length); "
                        "shorten the generation with <task>:max_new_tokens=N or use a longer model")
    half = limit // 2
    tail_start = len(ids) - half
    context_len = prompt.context_len
    if context_len >= tail_start:
        context_len -= tail_start - half
    elif context_len > half:
        context_len = half
    return Prompt(ids[:half] + ids[tail_start:], context_len)


def first_turn(spec, context: str, turn: dict, tokenizer, limit: int | None, use_chat: bool) -> Prompt:
    """The first turn: template, chat template, tokens, then truncation; context = tokens before its question."""
    values = turn_values(turn, context)
    text = spec.template.format(**values)
    question = spec.template.split("{context}", 1)[1].format(**values)
    chat = use_chat and has_chat_template(tokenizer)
    rendered = render_chat(tokenizer, text) if chat else text
    boundary = locate_question(rendered, [question], len(rendered))
    return truncate_tokens(tokenize_with_boundary(tokenizer, rendered, boundary, special_tokens=not chat), limit)


def follow_up_text(spec, tokenizer, use_chat: bool, gold_history: bool, previous: dict, turn: dict) -> str:
    """A later turn's text, as create_multiturn_prompt writes it (see the module docstring)."""
    values = turn_values(turn)
    if not (use_chat and has_chat_template(tokenizer)):
        template = spec.gold_follow_up if gold_history else spec.follow_up
        return template.format(pre_ans=str(previous["answer"]), **values)

    def render(messages: list[dict], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)

    system = [{"role": "system", "content": ""}]
    user = [{"role": "user", "content": spec.follow_up.format(**values)}]
    if gold_history:
        answer = [{"role": "assistant", "content": str(previous["answer"])}]
        return render(system + answer + user, True).replace(render(system, True), "")
    return render(user, True).replace(render(system, False), "")


def turn_prompt(spec, context: str, turns: list[dict], index: int, tokenizer, limit: int | None,
                use_chat: bool) -> Prompt:
    """Turn ``index``'s prompt: with gold history the whole conversation up to its question, else the first
    turn and its own follow-up; ``turn_start`` marks the tokens the turn adds."""
    first = first_turn(spec, context, turns[0], tokenizer, limit, use_chat)
    if index == 0:
        return first
    gold = spec.history == "gold"
    ids = list(first.input_ids)
    for later in range(1 if gold else index, index + 1):
        text = follow_up_text(spec, tokenizer, use_chat, gold, turns[later - 1], turns[later])
        added = encode(tokenizer, text, special_tokens=False)
        turn_start = len(ids)
        ids += added
    return Prompt(ids, first.context_len, turn_start)
