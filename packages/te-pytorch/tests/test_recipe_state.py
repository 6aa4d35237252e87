"""RecipeState: one object per module and direction answers what a recipe
means (quantizers, the FP8 dimension rule, the operand format), so that the
modules never test the recipe's kind on a forward, and the autograd functions
write no module state."""

from __future__ import annotations

import warnings

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.common.recipe import Recipe
from transformer_engine.pytorch.module import _layernorm_mlp_fn, _linear_fn
from transformer_engine.pytorch.recipe_state import RecipeState
from transformer_engine.pytorch.tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.recipe, pytest.mark.module, pytest.mark.usefixtures("te_state")]

# Per recipe, written out here (not read from the code under test): the
# quantizer class, the operand format and the multiples (tokens, in_features,
# out_features) of the GEMM dims: per-tensor FP8 takes the reference's rule
# (assert_dim_for_fp8_exec: the leading dims by 8, the last by 16).
CASES = {
    "delayed": (recipe.DelayedScaling, Float8Quantizer, "fp8", (8, 16, 8)),
    "current": (recipe.Float8CurrentScaling, Float8CurrentScalingQuantizer, "fp8", (8, 16, 8)),
    "mxfp8": (recipe.MXFP8BlockScaling, MXFP8Quantizer, "mxfp8", (32, 32, 32)),
    "block": (recipe.Float8BlockScaling, Float8BlockQuantizer, "fp8_block", (16, 16, 16)),
    "nvfp4": (recipe.NVFP4BlockScaling, NVFP4Quantizer, "nvfp4", (32, 32, 32)),
}
PER_RECIPE = pytest.mark.parametrize("name", list(CASES))
KIND_PREDICATES = (
    "delayed",
    "float8_current_scaling",
    "float8_per_tensor_scaling",
    "float8_block_scaling",
    "mxfp8",
    "nvfp4",
    "custom",
)


@PER_RECIPE
@pytest.mark.parametrize("mode, count", [("forward", 6), ("backward", 4)])
def test_each_recipe_gets_its_quantizers_and_format(name, mode, count):
    recipe_cls, quantizer_cls, kind, _ = CASES[name]
    state = RecipeState.create(recipe_cls(), mode=mode, num_quantizers=count, device="cpu")
    quantizers = state.make_quantizers()
    assert len(quantizers) == count
    assert all(type(q) is quantizer_cls for q in quantizers)
    assert state.operand_kind == kind
    assert state.per_tensor == (kind == "fp8")
    assert state.delayed == (name == "delayed")


@PER_RECIPE
def test_the_dimension_rule_of_each_recipe(name):
    recipe_cls, _, kind, multiples = CASES[name]
    state = RecipeState.create(recipe_cls(), mode="forward", num_quantizers=3, device="cpu")
    good = (multiples[0], 2 * multiples[1], 3 * multiples[2])
    state.check_dims(*good, "te.X")  # (no error)
    for i, what in enumerate(("tokens", "in_features", "out_features")):
        dims = list(good)
        dims[i] += multiples[i] // 2
        with pytest.raises(ValueError, match=rf"te\.X under {kind.upper()} .*{what}[^,]*? by {multiples[i]}"):
            state.check_dims(*dims, "te.X")


@pytest.mark.parametrize("name", ["delayed", "current"])
@pytest.mark.parametrize("module", [te.Linear, te.LayerNormLinear, te.LayerNormMLP])
def test_each_module_applies_the_rule(name, module):
    layer = module(32, 32, device="cpu")
    with pytest.raises(ValueError, match="divisible by 8.*got tokens=4"), te.autocast(recipe=CASES[name][0]()):
        layer(torch.randn(4, 32))


def _modules():
    return [
        te.Linear(64, 32, device="cpu"),
        te.LayerNormLinear(64, 32, device="cpu"),
        te.LayerNormMLP(64, 32, device="cpu"),
    ]


@PER_RECIPE
def test_forwards_do_not_ask_the_recipe_its_kind(name, monkeypatch):
    """After the first step built the state, later steps (forward and backward,
    the delayed-scaling updates included) run without a kind predicate."""
    fp8_recipe = CASES[name][0]()
    x = torch.randn(32, 64, requires_grad=True)
    modules = _modules()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (emulated block GEMMs)
        for step in range(3):
            if step == 1:
                for predicate in KIND_PREDICATES:
                    monkeypatch.setattr(Recipe, predicate, classmethod(lambda cls: pytest.fail("kind asked")))
            with te.autocast(recipe=fp8_recipe):
                outs = [m(x, is_first_microbatch=step == 0) for m in modules]
            sum(o.float().sum() for o in outs).backward()


def _record_module_writes(monkeypatch, functions) -> list:
    """The (module class, attribute) writes made while a function's forward runs."""
    writes, inside = [], []
    for function in functions:
        original = function.forward

        def forward(*args, original=original, **kwargs):
            inside.append(True)
            try:
                return original(*args, **kwargs)
            finally:
                inside.pop()

        monkeypatch.setattr(function, "forward", staticmethod(forward))
    setter = torch.nn.Module.__setattr__

    def recording(self, name, value):
        if inside:
            writes.append((type(self).__name__, name))
        setter(self, name, value)

    monkeypatch.setattr(torch.nn.Module, "__setattr__", recording)
    return writes


@pytest.mark.parametrize("name", ["delayed", "current", "mxfp8"])
def test_the_autograd_functions_write_no_module_state(name, monkeypatch):
    """Weight caching across microbatches: the module stores the quantized
    weights the function returns; the function itself sets no attribute."""
    linear, ln_linear, mlp = _modules()
    writes = _record_module_writes(monkeypatch, [_linear_fn.LinearFunction, _layernorm_mlp_fn.LayerNormMLPFunction])
    x = torch.randn(32, 64)
    with warnings.catch_warnings(), te.autocast(recipe=CASES[name][0]()):
        warnings.simplefilter("ignore")
        first = linear(x, is_first_microbatch=True)
        ln_linear(x, is_first_microbatch=True)
        mlp(x, is_first_microbatch=True)
        assert linear._weight_cache is not None and ln_linear._weight_cache is not None
        assert set(mlp._weight_cache) == {"fc1", "fc2"}
        with torch.no_grad():
            linear.weight.add_(1.0)
            linear.bias.add_(1.0)
        again = linear(x, is_first_microbatch=False)
    assert writes == []
    # The next microbatch reuses the cached weight, not the parameter: the
    # output moves by the bias alone.
    torch.testing.assert_close(again, first + 1.0, rtol=0, atol=1e-5)


def test_nvfp4_options_not_yet_supported_are_named_in_order():
    fp8_recipe = recipe.NVFP4BlockScaling(
        row_scaled_activation=True, nvfp4_4over6="all", backward_override="high_precision"
    )
    expected = "backward_override='high_precision', row_scaled_activation=True, nvfp4_4over6='all' is not yet"
    with pytest.raises(NotImplementedError, match=expected), te.autocast(recipe=fp8_recipe):
        pass
    assert te.FP8GlobalStateManager.autocast_depth == 0


def test_a_recipe_of_no_kind_is_refused_by_name():
    class Mine(Recipe):
        pass

    with pytest.raises(TypeError, match="recipe Mine is not a quantization recipe"), te.autocast(recipe=Mine()):
        pass
