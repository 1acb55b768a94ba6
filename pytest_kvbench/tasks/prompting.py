"""Turning prompt text into token ids: middle truncation, chat templates, the context boundary.

LongBench truncates an over-long prompt in the middle (the instructions sit at both ends) by
decoding the first and last halves of its tokens; the chat template is applied afterwards.
The harness also needs to know where the context ends and the question begins (to compress
only the context in the query-agnostic protocol). Token boundaries move when text is joined,
so the boundary is located as a character offset in the final string and mapped to tokens
with the tokenizer's offset mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Prompt, Sample, Task
from .errors import TaskError


def encode(tokenizer, text: str, *, special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special_tokens)["input_ids"])


def middle_truncate(tokenizer, text: str, max_tokens: int | None, *,
                    odd_token_to_tail: bool = False) -> tuple[str, int | None]:
    """LongBench's truncation: keep the first and last ``max_tokens // 2`` tokens.

    ``odd_token_to_tail``: LongBench v2 writes the tail as ``ids[-max_len//2:]``, which Python
    reads as ``ids[(-max_len)//2:]``: for an odd ``max_len`` the tail keeps one token more, so
    exactly ``max_len`` tokens remain (LongBench v1 and InfiniteBench keep ``2 * (max_len // 2)``).
    Returns the (possibly shortened) text and, when truncated, the character offset where the
    kept tail starts.
    """
    ids = encode(tokenizer, text, special_tokens=True)
    if max_tokens is None or len(ids) <= max_tokens:
        return text, None
    half = max_tokens // 2
    tail_tokens = max_tokens - half if odd_token_to_tail else half
    head = tokenizer.decode(ids[:half], skip_special_tokens=True)
    tail = tokenizer.decode(ids[len(ids) - tail_tokens :], skip_special_tokens=True) if tail_tokens else ""
    return head + tail, len(head)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer, user_text: str) -> str:
    """The user turn wrapped in the tokenizer's chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
    )


def locate_question(text: str, candidates: list[str], fallback: int) -> int:
    """Character offset in ``text`` where the first findable candidate (searched from the end) starts."""
    for candidate in candidates:
        for variant in (candidate, candidate.strip()):
            if variant:
                found = text.rfind(variant)
                if found != -1:
                    return found
    return fallback


def tokenize_with_boundary(tokenizer, text: str, boundary: int, *, special_tokens: bool) -> Prompt:
    """Tokenize ``text``; the context is every token that starts before character ``boundary``.

    A token straddling the boundary belongs to the context; zero-width special tokens count
    where they stand (a leading BOS is context, a trailing EOS is question).
    """
    encoded = tokenizer(text, add_special_tokens=special_tokens, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    context_len = len(ids)
    for index, (start, end) in enumerate(encoded["offset_mapping"]):
        if end > start >= boundary:
            context_len = index
            break
    return Prompt(input_ids=ids, context_len=context_len)


def build_token_prompt(tokenizer, user_text: str, question: str, *, use_chat: bool,
                       answer_prefix: str = "", truncated_at: int | None = None) -> Prompt:
    """Apply the chat template (if asked and available), append the answer prefix, tokenize,
    and split context from question where ``question`` starts.

    If the question itself was cut by truncation, the boundary is the truncation point
    (``truncated_at``, a character offset in ``user_text``); if it cannot be found at all,
    everything before the answer prefix is context.
    """
    if use_chat and has_chat_template(tokenizer):
        text = render_chat(tokenizer, user_text) + answer_prefix
        special_tokens = False  # chat templates write their own BOS
    else:
        text = user_text + answer_prefix
        special_tokens = True
    search_end = len(text) - len(answer_prefix)
    candidates = [question]
    if truncated_at is not None:
        candidates.append(user_text[truncated_at:])
    boundary = locate_question(text[:search_end], candidates, search_end)
    return tokenize_with_boundary(tokenizer, text, boundary, special_tokens=special_tokens)


def build_truncated_prompt(tokenizer, text: str, question: str, max_prompt_tokens: int | None, *,
                           use_chat: bool, answer_prefix: str = "", odd_token_to_tail: bool = False) -> Prompt:
    """The whole path of a filled template: middle truncation, chat template, context boundary.

    TaskError when ``max_prompt_tokens`` leaves no room (a generation length such as InfiniteBench
    Math.Calc's 30,000 tokens exceeds a small model's positions)."""
    if max_prompt_tokens is not None and max_prompt_tokens <= 0:
        raise TaskError(f"no room for the prompt ({max_prompt_tokens} tokens left after the generation length); "
                        "shorten the generation with <task>:max_new_tokens=N or use a longer model")
    text, truncated_at = middle_truncate(tokenizer, text, max_prompt_tokens, odd_token_to_tail=odd_token_to_tail)
    return build_token_prompt(tokenizer, text, question, use_chat=use_chat, answer_prefix=answer_prefix,
                              truncated_at=truncated_at)


@dataclass(frozen=True)
class TemplateSpec:
    """What defines a TemplateTask read from ``{name}.jsonl`` files (InfiniteBench, SCBench)."""

    name: str
    template: str
    max_new_tokens: int
    metric_name: str

    @property
    def data_file(self) -> str:
        return f"{self.name}.jsonl"


class TemplateTask(Task):
    """A task whose prompt is one ``str.format`` template with a ``{context}`` field: the text after
    the context is the question part; the prompt is middle-truncated, then chat-templated."""

    use_chat_template = True

    def template(self) -> str:
        return self.spec.template

    def template_values(self, sample: Sample) -> dict:
        return {"context": sample.fields["context"], "input": sample.fields["input"]}

    def prompt_text(self, sample: Sample) -> str:
        """The official template filled with the record (before truncation and chat template)."""
        return self.template().format(**self.template_values(sample))

    def question_text(self, sample: Sample) -> str:
        """The part of the filled template after the context."""
        return self.template().split("{context}", 1)[1].format(**self.template_values(sample))

    def build_prompt(self, sample: Sample, tokenizer, max_prompt_tokens: int | None) -> Prompt:
        return build_truncated_prompt(tokenizer, self.prompt_text(sample), self.question_text(sample),
                                      max_prompt_tokens, use_chat=self.use_chat_template)
