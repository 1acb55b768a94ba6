"""scripts/measure/measure_methods.py's extrapolation of KVzip's cost to a 32-layer model from two short ones."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "measure"))
import measure_methods  # noqa: E402

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def costs(layers: int, plain_layer: float, repeat_layer: float, last_layer: float, fixed: float):
    """(plain, kvzip) CPU seconds of a model with `layers` layers under the cost model of the script."""
    plain = layers * plain_layer + fixed
    return plain, plain + (layers - 1) * repeat_layer + last_layer


@pytest.mark.parametrize("plain_layer,repeat_layer,last_layer,fixed", [(30.0, 33.0, 4.0, 1.5), (1.0, 2.5, 0.2, 0.0)])
def test_two_layer_counts_give_the_ratio_of_a_deeper_model(plain_layer, repeat_layer, last_layer, fixed):
    runs = {layers: costs(layers, plain_layer, repeat_layer, last_layer, fixed) for layers in (2, 4)}
    plain, kvzip = costs(32, plain_layer, repeat_layer, last_layer, fixed)
    assert measure_methods.kvzip_extrapolated(runs, 32) == pytest.approx(kvzip / plain)
    # the last layer only scores: a deeper model pays more of the full repeat layers than a 4-layer one
    assert measure_methods.kvzip_extrapolated(runs, 32) > runs[4][1] / runs[4][0]

