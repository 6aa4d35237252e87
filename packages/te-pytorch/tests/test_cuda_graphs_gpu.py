"""CUDA-graph capture of a training step of te.Linear, te.LayerNormLinear and
te.LayerNormMLP (GPU only).

A step -- te.autocast forward, backward, optionally an SGD step -- is
captured once with torch.cuda.graph and replayed on new input values. An
eager copy of the layer runs the same steps on the same values; outputs,
gradients, weights and the delayed-scaling state must be bit-identical
(same kernels, same inputs). Capture itself fails on any host sync or
pageable copy inside the step, so a passing capture also shows the step
has none. For DelayedScaling the amax-history roll and scale update (at
autocast exit and at the end of backward) are inside the graph: each replay
advances the history exactly as an eager step does.
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import cuda_ready

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("te_state"), pytest.mark.module]

RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
}
SHAPE = (2, 16, 64)  # 32 tokens (a multiple of 16, as FP8 GEMMs need) of 64 features
OUT_FEATURES = 128
# module kind -> (factory, output features)
MODULES = {
    "linear": (lambda: te.Linear(SHAPE[-1], OUT_FEATURES, params_dtype=torch.bfloat16, device="cuda"), OUT_FEATURES),
    "layernorm_linear": (
        lambda: te.LayerNormLinear(SHAPE[-1], OUT_FEATURES, params_dtype=torch.bfloat16, device="cuda"),
        OUT_FEATURES,
    ),
    "layernorm_mlp": (
        lambda: te.LayerNormMLP(
            SHAPE[-1],
            OUT_FEATURES,
            normalization="RMSNorm",
            activation="swiglu",
            params_dtype=torch.bfloat16,
            device="cuda",
        ),
        SHAPE[-1],
    ),
}


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


def _pair(module: str = "linear"):
    """Two layers of a kind with the same parameters."""
    make = MODULES[module][0]
    a, b = make(), make()
    b.load_state_dict(a.state_dict())
    return a, b


def _step(layer, x, dy, fp8_recipe, optimizer):
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        y = layer(x)
    y.backward(dy)
    if optimizer is not None:
        optimizer.step()
    return y


def _fp8_state(layer):
    """(amax_history, scale) of the forward and backward delayed-scaling state, as copies."""
    state = []
    for key in ("scaling_fwd", "scaling_bwd"):
        meta = layer.fp8_meta[key]
        state += [meta.amax_history.clone(), meta.scale.clone()]
    return state


def _assert_equal(got, expected, what):
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype and g.shape == e.shape, f"{what}[{i}]"
        assert torch.equal(g, e), f"{what}[{i}] differs: max |diff| {(g.float() - e.float()).abs().max()}"


def _inputs(n, out_features=OUT_FEATURES):
    """n (x, dy) pairs in bfloat16."""
    shapes = (SHAPE, (*SHAPE[:-1], out_features))
    return [tuple(torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes) for _ in range(n)]


@pytest.mark.parametrize("with_optimizer", [False, True], ids=["fwd_bwd", "fwd_bwd_sgd"])
@pytest.mark.parametrize("recipe_name", [*RECIPES, "bf16"])
@pytest.mark.parametrize("module", list(MODULES))
def test_graphed_step_matches_eager(module, recipe_name, with_optimizer):
    fp8_recipe = RECIPES[recipe_name]() if recipe_name in RECIPES else None
    graphed, eager = _pair(module)
    out_features = MODULES[module][1]
    opt_g = torch.optim.SGD(graphed.parameters(), lr=0.01) if with_optimizer else None
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.01) if with_optimizer else None
    static_x = torch.zeros(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    static_dy = torch.zeros(*SHAPE[:-1], out_features, device="cuda", dtype=torch.bfloat16)
    warmup, replays = _inputs(3, out_features), _inputs(4, out_features)

    def load(x, dy):
        with torch.no_grad():
            static_x.copy_(x)
            static_dy.copy_(dy)

    # Warm-up on a side stream (torch.cuda.graph's rule), the same steps eagerly.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x, dy in warmup:
            load(x, dy)
            static_x.grad = None
            graphed.zero_grad(set_to_none=True)
            _step(graphed, static_x, static_dy, fp8_recipe, opt_g)
    torch.cuda.current_stream().wait_stream(side)
    for x, dy in warmup:
        eager.zero_grad(set_to_none=True)
        _step(eager, x.clone().requires_grad_(), dy, fp8_recipe, opt_e)

    # Capture: gradients are allocated by the graph (static across replays).
    static_x.grad = None
    graphed.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = _step(graphed, static_x, static_dy, fp8_recipe, opt_g)
    histories = []
    for x, dy in replays:
        load(x, dy)
        graph.replay()
        eager.zero_grad(set_to_none=True)
        x_e = x.clone().requires_grad_()
        y_e = _step(eager, x_e, dy, fp8_recipe, opt_e)
        torch.cuda.synchronize()
        _assert_equal([static_y, static_x.grad], [y_e, x_e.grad], "output, input grad")
        _assert_equal(
            [p.grad for p in graphed.parameters()] + list(graphed.parameters()),
            [p.grad for p in eager.parameters()] + list(eager.parameters()),
            "parameter grads, parameters",
        )
        if recipe_name == "delayed":
            state = _fp8_state(graphed)
            _assert_equal(state, _fp8_state(eager), "amax history / scale")
            histories.append(state[0])
    if recipe_name == "delayed" and module == "linear":
        # Each replay rolled the forward history by one row: the newest amaxes
        # (last row) of replay i are one row up after replay i + 1.
        for before, after in zip(histories, histories[1:]):
            assert torch.equal(after[-2], before[-1])
            assert (after[-1][:2] > 0).all()  # input and weight amaxes (slot 2, the output, is unused)


def test_make_graphed_callables_current_scaling():
    """torch.cuda.make_graphed_callables on the layer (separate forward and
    backward graphs), called inside te.autocast with current scaling (no
    state outside the graphs): bit-identical to eager. (DelayedScaling's
    update is driven from Python at autocast exit, which a graphed callable
    skips: capture the whole step with torch.cuda.graph instead.)"""
    fp8_recipe = recipe.Float8CurrentScaling()
    graphed, eager = _pair()
    sample = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(recipe=fp8_recipe):
        graphed_fn = torch.cuda.make_graphed_callables(graphed, (sample,), num_warmup_iters=3)
    for x, dy in _inputs(3):
        x_g, x_e = x.clone().requires_grad_(), x.clone().requires_grad_()
        with te.autocast(recipe=fp8_recipe):
            y_g = graphed_fn(x_g)
        y_g.backward(dy)
        with te.autocast(recipe=fp8_recipe):
            y_e = eager(x_e)
        y_e.backward(dy)
        torch.cuda.synchronize()
        _assert_equal([y_g, x_g.grad], [y_e, x_e.grad], "output, input grad")


@pytest.mark.parametrize("recipe_name", ["bf16", "delayed"])
def test_graphed_large_layernorm_mlp_step_runs(recipe_name):
    """A LayerNormMLP step large enough for the core's timed GEMM choice (BF16
    GEMMs of >= 2^32 multiply-adds are timed the first time they are seen,
    outside capture) captures and replays to the eager step's values. (The
    4096/14336 step failed to capture in bench_te_pytorch_mlp.py on the H200.)"""
    fp8_recipe = RECIPES[recipe_name]() if recipe_name in RECIPES else None

    def make():
        return te.LayerNormMLP(
            1024, 2048, normalization="RMSNorm", activation="swiglu", params_dtype=torch.bfloat16, device="cuda"
        )

    graphed, eager = make(), make()
    eager.load_state_dict(graphed.state_dict())
    static_x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    static_dy = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_x.grad = None
            graphed.zero_grad(set_to_none=True)
            _step(graphed, static_x, static_dy, fp8_recipe, None)
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        eager.zero_grad(set_to_none=True)
        _step(eager, static_x.detach().clone().requires_grad_(), static_dy, fp8_recipe, None)
    static_x.grad = None
    graphed.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = _step(graphed, static_x, static_dy, fp8_recipe, None)
    graph.replay()
    eager.zero_grad(set_to_none=True)
    x_e = static_x.detach().clone().requires_grad_()
    y_e = _step(eager, x_e, static_dy, fp8_recipe, None)
    torch.cuda.synchronize()
    # (The same kernels on the same values, but the timed GEMM choice may differ
    # between the graph's buffers and the eager ones: compare to BF16 rounding.)
    for got, want, name in ((static_y, y_e, "y"), (static_x.grad, x_e.grad, "dx")):
        err = (got.float() - want.float()).abs().max().item()
        scale = want.float().abs().max().item()
        assert err <= 2.0**-6 * scale, f"{name}: max |diff| {err} against max |value| {scale}"
