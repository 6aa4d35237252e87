"""Shared fixtures of the te-pytorch tests.

Every test that takes `device` runs on the CPU (te-core's CPU backend, in CI)
and, marked gpu, on CUDA when torch sees a GPU and te-core has its CUDA
backend: the same test code checks both backends.
Inputs are fresh random values each run; the seed is printed so that a
failure can be replayed (TE_TEST_SEED=<seed>).
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")

import transformer_engine.core as te_core
from transformer_engine.pytorch import FP8GlobalStateManager


def cuda_ready() -> bool:
    return torch.cuda.is_available() and te_core.built_with_cuda()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda" and not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    return torch.device(request.param)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """torch's OpenMP workers spin after each op and compete with te-core's
    CPU threads (tiny ops then take milliseconds); one intra-op thread keeps
    the suite fast on small CI machines."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _fresh_state():
    """A fresh seed per test (printed) and a clean global FP8 state."""
    seed = int(os.environ.get("TE_TEST_SEED", random.randrange(2**31)))
    print(f"TE_TEST_SEED={seed}")
    torch.manual_seed(seed)
    FP8GlobalStateManager.reset()
    yield
    FP8GlobalStateManager.reset()


@pytest.fixture
def gloo_world(tmp_path):
    """A single-process gloo process group (the default group), destroyed after the test."""
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
