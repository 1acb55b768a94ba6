"""transformers' quantized cache backends as the `hf_quantized` method: an optional extra, a one-line usage
error when the backend is missing, and bytes counted from whatever tensors the backend packs."""

import importlib.util

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.runtime.generation import generate
from kvmethods.storage.hf_quantized import tensor_bytes
from kvmethods.testing import tiny_model
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)
from helpers import GRID

HAS_QUANTO = importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("optimum.quanto") is not None
HAS_HQQ = importlib.util.find_spec("hqq") is not None


def test_tensor_bytes_walk_containers():
    held = [torch.zeros(4, dtype=torch.uint8), {"scale": torch.zeros(2, dtype=torch.float16), "n": 3}, (torch.zeros(1),)]
    assert tensor_bytes(held) == 4 + 4 + 4


@pytest.mark.skipif(HAS_HQQ, reason="hqq is installed")
def test_a_missing_backend_is_a_one_line_usage_error_at_collection(bench):
    result = bench.runpytest(*GRID, "--kvbench-methods", "hf_quantized:backend=hqq")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "hf_quantized: backend 'hqq' is not installed: pip install 'pytest-kvbench[hqq]'" in err
    assert "Traceback" not in err


@pytest.mark.skipif(not HAS_QUANTO, reason="needs optimum-quanto (pip install 'pytest-kvbench[quanto]')")
def test_quanto_stores_the_prompt_quantized_and_reports_the_packed_bytes():
    with pytest.raises(MethodError, match="supports bits 2, 4, got 3"):
        get_method("hf_quantized", bits=3)
    model = tiny_model("llama", seed=3, qk_scale=4.0, hidden_size=128)
    prompt = torch.randint(3, 256, (256,), generator=torch.Generator().manual_seed(2)).tolist()
    full = generate(model, get_method("full"), "r0", prompt, 256, 4, set(), "question_in_window")
    out = generate(model, get_method("hf_quantized", bits=4), "r0", prompt, 256, 4, set(), "question_in_window",
                   teacher_targets=full.tokens)
    assert out.kept_tokens_per_layer == full.kept_tokens_per_layer
    assert out.kv_bytes_logical == full.kv_bytes_physical
    assert 0 < out.kv_bytes_physical < full.kv_bytes_physical / 3  # 4-bit codes in fp32's place, plus scales
    assert out.target_logprobs.shape[0] == len(full.tokens)
