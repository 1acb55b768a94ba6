"""What benchmark a record measured: the fingerprint a gate checks before it compares scores.

Fidelity compares each method with the full cache of the same run, so a change that moves the reference and
the compressed items alike (a prompt template, a stop rule, a metric) cancels out, and a baseline from before
it is compared as if it were the same benchmark. A record therefore carries, beside its scores:

- ``benchmark``: the task's ``version`` (bumped whenever its prompt or scoring changes, docs/tasks.md), its
  metric, the generation settings (max_new_tokens, the stop rule, the chat template's digest), and what the
  outputs were computed on (``outputs_on``: device type, CPU model, torch, threads);
- per sample, ``prompt_digest`` (the prompt's token ids) and ``output_digest`` (the generated token ids: on the
  full-cache item, the reference output that every method is measured against).

Digests are the first 16 hex digits of a sha256: short enough to store per sample, far from colliding.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

DIGEST_CHARS = 16
STOP_RULE = "eos or max_new_tokens"  # generation ends at the model's end-of-sequence token or the task's length
SAMPLE_DIGESTS = ("prompt_digest", "output_digest")


def token_digest(token_ids: Iterable[int]) -> str:
    """The digest of a sequence of token ids (the same ids give the same digest on any machine)."""
    text = ",".join(str(int(token)) for token in token_ids)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:DIGEST_CHARS]


def text_digest(text: object) -> str | None:
    """The digest of a text (a tokenizer's named chat templates: a dict, read in key order); None for None."""
    if text is None:
        return None
    spelled = text if isinstance(text, str) else json.dumps(text, sort_keys=True, default=str)
    return hashlib.sha256(spelled.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


OUTPUTS_ON = ("type", "cpu_model", "torch", "threads")  # what decides whether two runs' outputs are bitwise equal


def benchmark_of(task, eos_token_ids: Iterable[int], chat_template: str | None, device: dict) -> dict:
    """The record's ``benchmark``: the task's version and metric, the settings its outputs were generated
    with, and what they were computed on (``outputs_on``: where the same inputs give bitwise the same outputs).
    ``chat_template``: the tokenizer's (None: the task's prompts are plain text); ``device``: the record's."""
    settings = {"max_new_tokens": task.max_new_tokens, "stop": STOP_RULE,
                "eos_token_ids": sorted({int(token) for token in eos_token_ids}),
                "chat_template": text_digest(chat_template) if getattr(task, "use_chat_template", True) else None}
    follow_up = getattr(task, "follow_up_max_new_tokens", None)
    if follow_up is not None:
        settings["follow_up_max_new_tokens"] = follow_up
    return {"task_version": task.version, "metric": task.metric_name, "settings": settings,
            "outputs_on": {name: device.get(name) for name in OUTPUTS_ON}}
