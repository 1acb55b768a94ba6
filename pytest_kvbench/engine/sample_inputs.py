"""A worker's task inputs, made once and read by every item of a reference group: a case's samples and each
sample's tokenized prompt (the runner, its group prefiller and a serving engine's items read the same)."""

from __future__ import annotations

from typing import Any

from pytest_kvbench.cases import Case, Grid
from pytest_kvbench.engine.models import LoadedModel


class SampleInputs:
    """Samples and prompts of the grid's cases, cached for the worker's life."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self._samples: dict[tuple, list] = {}
        self._prompts: dict[tuple, Any] = {}

    def samples(self, case: Case, task, loaded: LoadedModel) -> list:
        """The case's samples, loaded once per worker."""
        key = (case.model, case.task, case.samples, case.seed, case.context_length, self.grid.data_dir)
        if key not in self._samples:
            self._samples[key] = task.load_samples(
                loaded.tokenizer,
                n=case.samples,
                seed=case.seed,
                data_dir=self.grid.data_dir,
                context_length=case.context_length,
            )
        return self._samples[key]

    def max_prompt_tokens(self, task, loaded: LoadedModel) -> int | None:
        """The longest prompt the task may build for this model (--kvbench-max-prompt-tokens, else what its positions
        leave after the answer)."""
        if self.grid.max_prompt_tokens:
            return self.grid.max_prompt_tokens
        if loaded.max_positions:
            return loaded.max_positions - task.max_new_tokens
        return None

    def prompt(self, case: Case, task, sample, loaded: LoadedModel):
        """The sample's prompt, built once per worker (every method and budget of the case's group reads it)."""
        key = (case.model, case.task, case.seed, case.context_length, sample.id)
        if key not in self._prompts:
            self._prompts[key] = task.build_prompt(sample, loaded.tokenizer, self.max_prompt_tokens(task, loaded))
        return self._prompts[key]
