"""A tiny-model convergence check of te-jax's FP8 dense and of the fused
layernorm_mlp (examples/jax_dense_demo.py):
with each FP8 recipe the MLP's loss falls like the high-precision run's and ends
within a few percent of it (DESIGN: the recipes are trustworthy when this holds)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from transformer_engine.common import recipe

pytestmark = pytest.mark.module

DEMO = Path(__file__).resolve().parents[3] / "examples" / "jax_dense_demo.py"


def _demo():
    spec = importlib.util.spec_from_file_location("jax_dense_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "fp8_recipe",
    [
        recipe.DelayedScaling(amax_history_len=16),
        recipe.Float8CurrentScaling(),
        recipe.MXFP8BlockScaling(),
        recipe.Float8BlockScaling(),
        recipe.NVFP4BlockScaling(),
    ],
    ids=["delayed", "current", "mxfp8", "fp8_block", "nvfp4"],
)
@pytest.mark.parametrize("model", ["dense", "layernorm_mlp"])
def test_fp8_training_tracks_high_precision(fp8_recipe, model):
    demo = _demo()
    steps = 60
    reference = demo.train(None, steps, model=model)
    fp8 = demo.train(fp8_recipe, steps, model=model)
    assert reference[-1] < 0.7 * reference[0]  # the task is learnable in this many steps
    assert fp8[-1] < 0.7 * fp8[0]
    # FP8 (E4M3 forward, E5M2 gradients) ends within 3% of the high-precision loss
    assert abs(fp8[-1] - reference[-1]) <= 0.03 * reference[-1]
