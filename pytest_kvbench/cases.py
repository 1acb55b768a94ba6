"""The model of a benchmark case: which (model, method, budget, task, context length, seed, protocol)
cases a grid holds, and how each is named.

The engine runs a Case, the pytest wiring makes one item of each, the results are keyed by it: so the model
lives here, below all three. The grid is resolved once per session from options, ini keys and a TOML file
(wiring/grid/options.py) and validated, before any model loads, so that a typo is a one-line usage error rather
than a crash an hour into a sweep. Each Case knows its pytest id, which must stay stable across runs
(``--lf`` and baselines depend on it), and its comparison key, which results/record/__init__.py parses back.

No compression is ``kvmethods.FULL_CACHE``: the budget of the `full` method's cases (one per task, whatever
the budgets), spelled "full" in keys and labels, left out of item ids.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from kvmethods import FULL_CACHE, Budget, Capability, describe_method
from kvmethods.spec import MethodSpec  # the one method-spec grammar; Case and the grid file name it here
from pytest_kvbench.input_values import MAX_SAMPLES, InputError, ascii_int
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL
from pytest_kvbench.record_key import DEFAULT_PROTOCOL, DEFAULT_SLIDING, ItemKey, protocol_key_part, task_label


def model_label(model: str) -> str:
    """A short, path- and id-safe name for a model id or path (item ids, item folders)."""
    tail = model.rstrip("/").split("/")[-1] or model
    return re.sub(r"[^A-Za-z0-9._-]+", "_", tail)


GridError = InputError  # a grid value that cannot be used; the message is one line naming the valid choices
# --kvbench-measure-alone: a method's own decode speed measured on one sample alone per item (the default) or per
# method (engine/sample_outcomes.alone_key)
MEASURE_ALONE = ("item", "method")


@dataclass(frozen=True)
class Case:
    """One pytest item: everything needed to run and to name it."""

    model: str
    method: MethodSpec
    budget: Budget  # FULL_CACHE for the uncompressed reference (the `full` method)
    task: str
    suite: str
    context_length: int | None
    seed: int
    samples: int | None
    smoke: bool = False
    show_model: bool = False
    show_seed: bool = False
    protocol: str = DEFAULT_PROTOCOL
    # --kvbench-sliding: "compress" when the method compresses sliding-window layers too (only methods that evict
    # tokens; the others' cases keep the default, their results being the same either way)
    sliding: str = DEFAULT_SLIDING

    @property
    def is_reference(self) -> bool:
        """The uncompressed full-cache run: the fidelity reference of its reference group. An engine's cache type
        (``llamacpp:f16``) runs once per task too, at no budget of the grid's, but is no reference."""
        return self.budget == FULL_CACHE and not self.method.is_engine

    @property
    def id(self) -> str:
        parts = [self.method.label]
        if self.budget != FULL_CACHE:
            parts.append(self.budget.spec)
        parts.append(self.task)
        if self.context_length is not None:
            parts.append(f"ctx{self.context_length}")
        if self.show_seed:
            parts.append(f"seed{self.seed}")
        if self.show_model:
            parts.append(model_label(self.model))
        if self.protocol != DEFAULT_PROTOCOL:
            parts.append(self.protocol)
        if self.sliding != DEFAULT_SLIDING:
            parts.append(f"sliding_{self.sliding}")
        return "-".join(parts)

    @property
    def reference_group(self) -> str:
        """The items that share one full-cache reference pass: same model, task, length and seed.

        Keeping such items on one xdist worker computes each reference once per run, not once per
        worker that meets the task."""
        task = task_label(self.task, self.context_length)
        return f"{self.model}|{task}|seed{self.seed}" + protocol_key_part(self.protocol)

    @property
    def key(self) -> str:
        """The comparison key of baselines: one entry per model/method/budget/task/length/seed."""
        return ItemKey.of(self.model, self.method.label, self.budget.spec, self.task, self.context_length,
                          self.seed, self.protocol, self.sliding).text


@dataclass
class Grid:
    models: list[str] = field(default_factory=lambda: [DEFAULT_MODEL])
    methods: list[MethodSpec] = field(default_factory=list)
    budgets: list[Budget] = field(default_factory=list)  # parsed once, by wiring/grid/options.py
    # The budgets of the methods that evict nothing (quantizers, ThinK: a token budget means nothing to a method
    # that keeps every token), when no budget was given: the default byte budget (wiring/grid/options.py). Empty:
    # every method runs at `budgets`, as it does whenever budgets are given.
    storage_budgets: list[Budget] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    tasks_named: bool = False  # the user listed the tasks (else the default grid: default_selection.py)
    tasks_added: list[str] = field(default_factory=list)  # named by -k / -m, added to the default grid (named_tasks.py)
    tasks_unavailable: list[str] = field(default_factory=list)  # named by -k / -m, but without data or extra here
    smoke_tasks: list[str] = field(default_factory=list)
    context_lengths: list[int] = field(default_factory=list)
    samples: int | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    protocols: list[str] = field(default_factory=lambda: [DEFAULT_PROTOCOL])
    # (task, protocol) pairs a default task cannot serve (multi_turn without turns): no case
    unserved: set[tuple[str, str]] = field(default_factory=set)
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    data_dir: str | None = None
    max_prompt_tokens: int | None = None
    preset: str | None = None  # --kvbench-preset: the published evaluation the grid follows
    sliding: str = DEFAULT_SLIDING  # --kvbench-sliding: keep sliding-window layers as their window, or compress
    measure_alone: str = MEASURE_ALONE[0]  # --kvbench-measure-alone: a method's own decode speed per item or method

    @property
    def protocol(self) -> str:
        """The grid's protocols as one string (run.json, settings that `kvbench merge` compares)."""
        return ",".join(self.protocols)

    def cases(self, suite: str, suite_of) -> list[Case]:
        """All cases of one suite, in a stable order (model, task, method, budget, length, seed,
        protocol); the (task, protocol) pairs in `unserved` are left out."""
        show_model = len(self.models) > 1
        show_seed = len(self.seeds) > 1
        out: list[Case] = []
        for model in self.models:
            for task in self.tasks:
                if suite_of(task) != suite:
                    continue
                lengths = self.context_lengths if suite == "ruler" else [None]
                for method in self.methods:
                    # a method that changes nothing (full) has no budget axis: it runs once, uncompressed
                    capabilities = describe_method(method.name, **method.param_dict).capabilities
                    sliding = self.sliding if Capability.COMPRESSES in capabilities else DEFAULT_SLIDING
                    budgets = self.budgets_of(capabilities)
                    smallest = min(budgets, key=lambda budget: budget.sort_key) if budgets else None
                    for budget in budgets:
                        for length in lengths:
                            for seed, protocol in itertools.product(self.seeds, self.protocols):
                                if (task, protocol) in self.unserved:
                                    continue
                                smoke = (
                                    task in self.smoke_tasks
                                    and budget == smallest  # of the method's own budgets
                                    and length == (lengths[0] if lengths else None)
                                    and seed == self.seeds[0]
                                    and model == self.models[0]
                                )
                                out.append(Case(model, method, budget, task, suite, length, seed,
                                                self.samples, smoke, show_model, show_seed, protocol, sliding))
        return out

    def budgets_of(self, capabilities: Capability) -> list[Budget]:
        """The budgets a method with these capabilities runs at: none but the full cache for a method that changes
        nothing (full); the storage budgets, when the grid has them, for one that evicts nothing; else `budgets`."""
        if not capabilities:
            return [FULL_CACHE]
        if self.storage_budgets and Capability.COMPRESSES not in capabilities:
            return self.storage_budgets
        return self.budgets

    def as_dict(self) -> dict:
        return {
            "models": list(self.models),
            "methods": [{"name": m.name, "params": dict(m.params)} for m in self.methods],
            "budgets": [budget.spec for budget in self.budgets],
            "tasks": list(self.tasks),
            "context_lengths": list(self.context_lengths),
            "samples": self.samples,
            "seeds": list(self.seeds),
            "protocol": self.protocol,
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "data_dir": self.data_dir,
            "max_prompt_tokens": self.max_prompt_tokens,
            "preset": self.preset,
        } | ({"sliding": self.sliding} if self.sliding != DEFAULT_SLIDING else {}) | (  # older runs' settings stay equal
            {"measure_alone": self.measure_alone} if self.measure_alone != MEASURE_ALONE[0] else {}) | (
            {"storage_budgets": [budget.spec for budget in self.storage_budgets]} if self.storage_budgets else {})


def parse_positive_int(text: Any, what: str, maximum: int = MAX_SAMPLES) -> int:
    """A positive integer up to ``maximum`` (input_values.py says why each bound) from an option, ini or
    TOML value; GridError otherwise."""
    return ascii_int(text, what, minimum=1, maximum=maximum)


MAX_SEED = 2**32 - 1  # the largest seed numpy accepts; torch's limit is larger


def parse_seed(text: Any, where: str = "seed") -> int:
    return ascii_int(text, where, minimum=0, maximum=MAX_SEED)
