"""te.make_graphed_callables: each replay equals one eager step inside te.autocast.

GPU tests (capture needs CUDA) compare a graphed module with an eager copy
over several optimizer steps: outputs, gradients and, under delayed scaling,
the scales and amax histories. The CPU tests check the argument rules.
"""

from __future__ import annotations

import copy

import pytest
import torch
from pt_helpers import cuda_ready

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.graph import _KwargBinding, _resolve_deprecated

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.module, pytest.mark.usefixtures("te_state")]


RECIPES = {
    "none": None,
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
}


def _states(model):
    out = []
    for m in model.modules():
        meta = getattr(m, "fp8_meta", None)
        if meta and meta["scaling_fwd"] is not None and hasattr(meta["scaling_fwd"], "scale"):
            for key in ("scaling_fwd", "scaling_bwd"):
                out += [meta[key].scale.clone(), meta[key].amax_history.clone()]
    return out


def _step(model, x, opt):
    opt.zero_grad(set_to_none=False)
    y = model(x)
    (y.float() ** 2).mean().backward()
    return y.detach().clone(), x.grad.clone(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(RECIPES))
def test_replays_equal_eager_steps(kind):
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    torch.manual_seed(0)
    hidden, warmup, steps = 128, 2, 4
    model = torch.nn.Sequential(
        te.LayerNormLinear(hidden, 2 * hidden, device="cuda"),
        te.Linear(2 * hidden, hidden, device="cuda"),
    ).to(torch.bfloat16)
    eager = copy.deepcopy(model)
    make = RECIPES[kind]
    rec = make() if make else None
    sample = torch.randn(64, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphed = te.make_graphed_callables(model, (sample,), num_warmup_iters=warmup, enabled=rec is not None, recipe=rec)
    # Warm-up and capture leave the FP8 state as it was: replays are compared
    # with eager steps from the same start.
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.1)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(64, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        got = _step(graphed, x, opt_g)
        x2 = x.detach().clone().requires_grad_(True)
        with te.autocast(enabled=rec is not None, recipe=rec):
            y = eager(x2)
        opt_e.zero_grad(set_to_none=False)
        (y.float() ** 2).mean().backward()
        want = (y.detach(), x2.grad, [p.grad for p in eager.parameters()])
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        for a, b in zip(got[2], want[2]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        opt_g.step()
        opt_e.step()
    for a, b in zip(_states(graphed), _states(eager)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
def test_functions_and_kwargs_are_graphed():
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    lin = te.Linear(64, 64, device="cuda")

    def fn(x, *, shift, scale=2.0):
        return lin(x) * scale + shift

    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    shift = torch.randn(64, device="cuda")
    g = te.make_graphed_callables(fn, (x,), sample_kwargs={"shift": shift, "scale": 2.0})
    x2 = torch.randn(32, 64, device="cuda", requires_grad=True)
    shift2 = torch.randn(64, device="cuda")
    out = g(x2, shift=shift2, scale=2.0)
    torch.testing.assert_close(out, lin(x2) * 2.0 + shift2)
    with pytest.raises(ValueError, match="fixed in the graph"):
        g(x2, shift=shift2, scale=3.0)


def test_cpu_samples_are_refused():
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="must be on a CUDA device"):
            te.make_graphed_callables(te.Linear(16, 16, device="cuda"), (torch.randn(16, 16),))
    else:
        with pytest.raises(RuntimeError, match="needs CUDA"):
            te.make_graphed_callables(te.Linear(16, 16, device="cpu"), (torch.randn(16, 16),))


def test_unsupported_options_say_so():
    with pytest.raises(NotImplementedError, match="_order"):
        te.make_graphed_callables(lambda x: x, (torch.randn(2),), _order=[1, -1])
    with pytest.raises(NotImplementedError, match="cache_quantized_params"):
        te.make_graphed_callables(lambda x: x, (torch.randn(2),), fp8_weight_caching=True)


def test_deprecated_names_map_to_the_new_ones():
    new = {
        "enabled": None,
        "calibrating": None,
        "recipe": None,
        "amax_reduction_group": None,
        "cache_quantized_params": None,
    }
    r = recipe.DelayedScaling()
    with pytest.warns(DeprecationWarning, match="fp8_recipe"):
        out = _resolve_deprecated(dict(new), {"fp8_enabled": None, "fp8_recipe": r})
    assert out["recipe"] is r
    with pytest.raises(ValueError, match="both given and differ"):
        _resolve_deprecated(dict(new, enabled=False), {"fp8_enabled": True})


def test_kwarg_binding_orders_tensor_kwargs():
    a, b = torch.randn(2), torch.randn(3)
    binding = _KwargBinding({"b": b, "mode": "x", "a": a})
    flat = binding.flat((torch.ones(1),), {"a": a, "b": b})
    assert [t.shape[0] for t in flat] == [1, 3, 2]
    got = binding.call(lambda x, *, a, b, mode: (x, a, b, mode), 1, *flat)
    assert got[3] == "x" and got[1] is a and got[2] is b
    with pytest.raises(TypeError, match="captured with"):
        binding.flat((), {"a": a})
