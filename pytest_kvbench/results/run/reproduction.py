"""`kvbench env RUN`: everything a user needs to make a run again, as one pip constraints file.

A score depends on more than the command: the package versions (transformers renames keep changing what a
forward does), the model's exact revision, dtype and attention implementation, and the commit. run.json
records them; this module writes them out so that the whole text is itself a valid constraints file (every
line but the `name==version` pins is a comment), e.g.

    kvbench env latest > run-constraints.txt
    pip install -c run-constraints.txt torch && pip install -c run-constraints.txt -e .
"""

from __future__ import annotations

from pytest_kvbench.results.run.directories import Run

SELF = "pytest-kvbench"  # installed from the commit, never pinned by version
MODEL_FIELDS = ("source", "revision", "dtype", "attn_implementation")
GRID_FIELDS = ("models", "methods", "budgets", "storage_budgets", "tasks", "context_lengths", "samples", "seeds",
               "protocol", "dtype", "attn_implementation", "data_dir", "max_prompt_tokens")


def _environments(run: Run) -> list[dict]:
    """The environment of the run, or of each run a merged run was made from."""
    sources = run.info.get("merged_from")
    if isinstance(sources, list) and sources:
        return [s.get("environment") or {} for s in sources if isinstance(s, dict)]
    return [run.environment]


def package_pins(environment: dict) -> tuple[list[str], bool]:
    """`name==version` for each package the environment recorded, and whether that was every installed package
    (runs from before `packages` was recorded name only the main ones). A local version tag (torch's +cpu,
    +cu128) is dropped: `torch==2.13.0` matches every build of that version, CPU or CUDA."""
    packages = environment.get("packages")
    complete = isinstance(packages, dict) and bool(packages)
    if not complete:
        packages = environment.get("versions") or {}
    pins = [f"{name}=={str(version).split('+')[0]}" for name, version in packages.items()
            if version and name.lower() != SELF]
    return sorted(pins, key=str.lower), complete


def model_lines(run: Run) -> list[str]:
    """One line per distinct model identity the run's items loaded (from their records), else the grid's."""
    seen: list[dict] = []
    for record in run.records:
        model = record.model
        if model.name:
            identity = {k: getattr(model, k) for k in ("name", *MODEL_FIELDS)}
            if identity not in seen:
                seen.append(identity)
    if not seen:
        grid = run.info.get("grid") or {}
        seen = [{"name": name, "dtype": grid.get("dtype"), "attn_implementation": grid.get("attn_implementation")}
                for name in grid.get("models") or []]
    return [f"model {m['name']}: " + ", ".join(f"{k}={m.get(k) or '-'}" for k in MODEL_FIELDS) for m in seen]


def grid_line(run: Run) -> str | None:
    grid = run.info.get("grid")
    if not isinstance(grid, dict):
        return None
    parts = []
    for name in GRID_FIELDS:
        value = grid.get(name)
        if name == "methods" and isinstance(value, list):
            value = [":".join([m.get("name", "?"), *(f"{k}={v}" for k, v in (m.get("params") or {}).items())])
                     for m in value if isinstance(m, dict)]
        if isinstance(value, list):
            value = ",".join(map(str, value))
        if value not in (None, ""):
            parts.append(f"{name}={value}")
    return "grid (as resolved from options, ini and TOML): " + " ".join(parts)


def reproduction_text(run: Run, command_lines: list[str]) -> str:
    """The constraints file: comments on what made the run (`command_lines`: commit, directory and pytest
    command, as `kvbench show --reproduce` prints them), then the package pins."""
    environments = _environments(run)
    pins, complete = package_pins(next((env for env in environments if env.get("packages")), environments[0]))
    lines = [f"# kvbench env {run.run_id}: what made this run. This text is a pip constraints file:",
             f"#   kvbench env {run.run_id} > run-constraints.txt",
             "#   pip install -c run-constraints.txt torch && pip install -c run-constraints.txt -e .",
             "# (-e . in a checkout of the commit below)"]
    python = next((env.get("python") for env in environments if env.get("python")), None)
    if python:
        lines.append(f"# python {python}")
    lines += [f"# {line}" for line in model_lines(run)]
    grid = grid_line(run)
    if grid:
        lines.append(f"# {grid}")
    lines.append("# the commit and the exact command:")
    lines += [line if line.startswith("#") else f"#   {line}" for line in command_lines]
    if not complete:
        lines.append("# only the main packages' versions were recorded by this run (not every installed one)")
    return "\n".join(lines + pins) + "\n"
