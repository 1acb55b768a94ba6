"""Shared pieces of the method tests: the four families and single-threaded tiny models.

Import `one_thread` into a test module to make it apply there (a module-scoped autouse fixture);
`MatmulDtypes` records the dtypes of the matrix products run inside it (methods computing in the model's dtype).
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvmethods.testing import tiny_model

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest single-threaded; several threads only contend on the shared CPU."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def sdpa_and_eager(family: str, *, seed: int, qk_scale: float):
    """The same float64 weights twice: with sdpa (the method side) and eager (the reference side)."""
    sdpa = tiny_model(family, seed=seed, dtype=torch.float64, qk_scale=qk_scale)
    eager = tiny_model(family, seed=seed + 1, dtype=torch.float64, attn_implementation="eager")
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


class MatmulDtypes(TorchDispatchMode):
    """Records the dtypes of the matrix products run while active."""

    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "bmm", "baddbmm", "addmm"):
            self.dtypes.add(args[0].dtype)
        return func(*args, **(kwargs or {}))
