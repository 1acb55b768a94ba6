"""Methods built around another method: head-adaptive budgets, compositions, per-turn and chunked prefill."""
