"""What a run was made with: enough to reproduce it, captured without importing heavy modules."""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def installed_packages() -> dict[str, str]:
    """Every installed distribution's version (what `pip freeze` lists), for `kvbench env`'s constraints. About
    0.5 s on a busy 2-core machine, so it is read once when the run is written (RunSession.finish), not at startup."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name not in found:  # the first on sys.path is the one imported
            found[name] = dist.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def capture_environment(invocation_args: list[str] | None = None) -> dict:
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    args = list(invocation_args if invocation_args is not None else sys.argv[1:])
    return {
        "git_commit": commit,
        "git_dirty": bool(status) if status is not None else None,
        "command": "pytest " + shlex.join(args),
        "cwd": os.getcwd(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in ("pytest-kvbench", "torch", "transformers", "datasets", "pytest", "pytest-xdist")},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE"),
    }


def with_fields(environment: dict, added: list[dict | None]) -> dict:
    """The environment block with the fields the pytest_kvbench_environment hooks returned; ValueError (one
    line) for a key the block already has."""
    merged = dict(environment)
    for fields in added:
        taken = sorted(set(fields or {}) & set(merged))
        if taken:
            raise ValueError(f"pytest_kvbench_environment returned {', '.join(map(repr, taken))}: the run's "
                             f"environment already has it; name yours otherwise")
        merged.update(fields or {})
    return merged


def environment_differences(baseline_env: dict, current_env: dict) -> list[str]:
    """What changed in the environment since the baseline: context for reading a verdict."""
    notes = []
    for name in ("git_commit", "host", "platform", "python"):
        old, new = baseline_env.get(name), current_env.get(name)
        if old is not None and new is not None and old != new:
            notes.append(f"{name}: {old} -> {new}")
    old_versions = baseline_env.get("versions") or {}
    new_versions = current_env.get("versions") or {}
    for package in sorted(set(old_versions) & set(new_versions)):
        if old_versions[package] != new_versions[package]:
            notes.append(f"{package}: {old_versions[package]} -> {new_versions[package]}")
    return notes
