"""Protocols that serve several questions from one compressed context (issue 17).

- shared_context.py: the context is compressed once, query-agnostic, and every question is answered on
  top of that cache, which goes back to its compressed state before the next (kvpress FAQ, KVzip);
- multi_turn.py: one context, k turns; each question and the model's own answer stay in the cache
  (SCBench's multi-turn mode).
Both build on generation.py's prefill, forward and greedy decoding; cache_snapshot.py restores a cache.
"""

from .multi_turn import run_turns
from .shared_context import answer_questions

__all__ = ["answer_questions", "run_turns"]
