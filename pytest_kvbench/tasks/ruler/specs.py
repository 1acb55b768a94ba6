"""The RULER task list with the official configuration of each (scripts/synthetic.yaml),
plus needle-depth grids for heatmaps."""

from __future__ import annotations

from .task import RulerSpec
from .templates import COMMON_WORDS, FREQ_WORDS, NIAH, QA, VARIABLE_TRACKING

# niah config name -> needs essays; kept here so building the registry does not import niah.py
_NIAH_TASKS = {
    "niah_single_1": False, "niah_single_2": True, "niah_single_3": True, "niah_multikey_1": True,
    "niah_multikey_2": False, "niah_multikey_3": False, "niah_multivalue": True, "niah_multiquery": True,
}


def ruler_specs() -> dict[str, RulerSpec]:
    specs = {
        name: RulerSpec(name, "niah", "string_match_all", NIAH.tokens_to_generate,
                        needs="essay" if essay else None, niah_config=name)
        for name, essay in _NIAH_TASKS.items()
    }
    specs["vt"] = RulerSpec("vt", "vt", "string_match_all", VARIABLE_TRACKING.tokens_to_generate)
    specs["cwe"] = RulerSpec("cwe", "cwe", "string_match_all", COMMON_WORDS.tokens_to_generate)
    specs["fwe"] = RulerSpec("fwe", "fwe", "string_match_all", FREQ_WORDS.tokens_to_generate)
    specs["qa_1"] = RulerSpec("qa_1", "qa", "string_match_part", QA.tokens_to_generate, needs="squad")
    specs["qa_2"] = RulerSpec("qa_2", "qa", "string_match_part", QA.tokens_to_generate, needs="hotpotqa")
    specs["niah_grid"] = RulerSpec("niah_grid", "niah", "string_match_all", NIAH.tokens_to_generate,
                                   niah_config="niah_single_1", grid=True)
    specs["niah_grid_essay"] = RulerSpec("niah_grid_essay", "niah", "string_match_all", NIAH.tokens_to_generate,
                                         needs="essay", niah_config="niah_single_2", grid=True)
    return specs
