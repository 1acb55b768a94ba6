"""A case's method, built, and whether its item takes its cache from its reference group's shared prefill.

Below the runner and its group prefiller (sample_prefills.py), which both ask; the plugin asks too, when it plans
the groups (run_plugin.py: torch is imported when items run)."""

from __future__ import annotations

from kvmethods import get_method
from kvmethods.runtime.shared_prefill import can_share_prefill
from pytest_kvbench.cases import Case


def method_of(case: Case):
    """The case's method, built; seeded methods follow the run's seed; sliding-window layers as the case says
    (--kvbench-sliding)."""
    params = dict(case.method.params)
    method = get_method(case.method.name, **params)
    if "seed" in method.params() and "seed" not in params:  # seeded methods follow the run's seed
        method = get_method(case.method.name, **params, seed=case.seed)  # wrappers (prefill_chunk) too
    return method.with_sliding_layers(case.sliding)


def shares_prefill(case: Case) -> bool:
    """Whether the case takes its prefill from its reference group's forward (the method's capability:
    kvmethods.runtime.shared_prefill.can_share_prefill); the reference itself makes that forward. An engine's
    cache type (serving/) prefills in the engine."""
    if case.method.is_engine:
        return False
    return case.is_reference or can_share_prefill(method_of(case))


def takes_shared_prefill(case: Case) -> bool:
    """A compressed item taking its cache from the group's forward (the reference makes that forward)."""
    return not case.is_reference and shares_prefill(case)
