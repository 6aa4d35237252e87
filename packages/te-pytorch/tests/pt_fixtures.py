"""Fixtures of the te-pytorch tests, loaded as a plugin by each test module:

    pytest_plugins = ["pt_fixtures"]
    pytestmark = pytest.mark.usefixtures("te_state")

(Not a conftest.py: pytest runs the te-core and te-pytorch suites in one
session, and te-core's tests import names from their conftest module, which a
second conftest.py would shadow. Plugin fixtures are visible session-wide, so
none of them is autouse: modules opt in with the pytestmark above.)

Every test that takes `device` runs on the CPU (te-core's CPU backend, in CI)
and, marked gpu, on CUDA when torch sees a GPU and te-core has its CUDA
backend: the same test code checks both backends. Inputs are fresh random
values each run; the seed is printed so that a failure can be replayed
(TE_TEST_SEED=<seed>).
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import cuda_ready

from transformer_engine.core.testing.seeds import draw_seed
from transformer_engine.pytorch import FP8GlobalStateManager, quantization

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda" and not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    return torch.device(request.param)


@pytest.fixture
def te_state():
    """A fresh seed per test (printed), a clean global FP8 state, and one torch
    intra-op thread: torch's OpenMP workers spin after each op and compete
    with te-core's CPU threads (tiny ops then take milliseconds)."""
    torch.manual_seed(draw_seed())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    FP8GlobalStateManager.reset()
    yield
    FP8GlobalStateManager.reset()
    quantization._AMAX_WATCH.pending.clear()  # (CUDA amax checks not yet reported belong to this test)
    torch.set_num_threads(threads)


@pytest.fixture
def gloo_world(tmp_path):
    """A single-process gloo process group (the default group), destroyed after the test."""
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
