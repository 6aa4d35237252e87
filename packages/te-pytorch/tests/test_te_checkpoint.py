"""te.checkpoint (activation recomputation) and CudaRNGStatesTracker.

The recomputed run must be identical to the run that saves its activations:
outputs, every gradient and, under delayed scaling, every scale and amax
history after several optimizer steps. The reference's own tests ask the same
(test_gpt_full_activation_recompute and its inner-autocast variant).
"""

from __future__ import annotations

import copy

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import distributed as te_dist

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.module, pytest.mark.usefixtures("te_state")]

RECIPES = {
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
}


class Block(torch.nn.Module):
    """LayerNormLinear -> LayerNormMLP -> Linear, with a dropout in the middle."""

    def __init__(self, hidden: int, device, p: float = 0.0) -> None:
        super().__init__()
        self.qkv = te.LayerNormLinear(hidden, hidden, device=device)
        self.mlp = te.LayerNormMLP(hidden, 2 * hidden, device=device)
        self.out = te.Linear(hidden, hidden, device=device)
        self.p = p

    def forward(self, x):
        y = self.qkv(x)
        y = torch.nn.functional.dropout(y, self.p, training=self.training)
        return self.out(self.mlp(y)) + x


class Model(torch.nn.Module):
    def __init__(self, hidden: int, layers: int, device, p: float = 0.0, recompute=None) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(hidden, device, p) for _ in range(layers))
        self.recompute = recompute  # None, or the te.checkpoint keyword arguments

    def forward(self, x):
        for block in self.blocks:
            if self.recompute is None:
                x = block(x)
            else:
                x = te.checkpoint(block, x, **self.recompute)
        return x


def _fp8_states(model):
    states = []
    for m in model.modules():
        meta = getattr(m, "fp8_meta", None)
        if meta is None or meta["scaling_fwd"] is None or not hasattr(meta["scaling_fwd"], "scale"):
            continue
        for key in ("scaling_fwd", "scaling_bwd"):
            states.append(meta[key].scale.clone())
            states.append(meta[key].amax_history.clone())
    return states


def _train(model, kind, steps, inputs, inner_autocast=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    outs, grads = [], []
    for x in inputs[:steps]:
        x = x.clone().requires_grad_(True)
        opt.zero_grad()
        if inner_autocast:
            y = model(x)  # the blocks enter autocast themselves
        else:
            with te.autocast(recipe=RECIPES[kind]()):
                y = model(x)
        (y.float() ** 2).mean().backward()
        outs.append(y.detach().clone())
        grads.append([x.grad.clone()] + [p.grad.clone() for p in model.parameters()])
        opt.step()
    return outs, grads, _fp8_states(model)


def _assert_same(a, b):
    outs_a, grads_a, states_a = a
    outs_b, grads_b, states_b = b
    for x, y in zip(outs_a, outs_b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    for ga, gb in zip(grads_a, grads_b):
        for x, y in zip(ga, gb):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert len(states_a) == len(states_b)
    for x, y in zip(states_a, states_b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("kind", list(RECIPES))
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_recompute_is_identical_to_saving(device, kind, use_reentrant):
    hidden, steps = 64, 3
    torch.manual_seed(1)
    eager = Model(hidden, 2, device)
    recomputed = copy.deepcopy(eager)
    recomputed.recompute = {"use_reentrant": use_reentrant}
    inputs = [torch.randn(4, 8, hidden, device=device) for _ in range(steps)]
    reference = _train(eager, kind, steps, inputs)
    result = _train(recomputed, kind, steps, inputs)
    _assert_same(reference, result)
    if kind == "delayed":  # the state moved: the test compares something that changes
        assert any(s.abs().sum() > 0 for s in reference[2])


def test_checkpoint_inner_autocast(device):
    """The checkpointed function enters te.autocast itself (the reference's
    _with_inner_autocast variant): the recompute is an FP8 region too."""
    hidden, steps = 32, 3

    class Inner(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            with te.autocast(recipe=recipe.DelayedScaling(amax_history_len=3)):
                return self.block(x)

    torch.manual_seed(2)
    eager = torch.nn.Sequential(Inner(Block(hidden, device)), Inner(Block(hidden, device)))
    wrapped = copy.deepcopy(eager)

    class Recompute(torch.nn.Module):
        def __init__(self, seq):
            super().__init__()
            self.seq = seq

        def forward(self, x):
            for m in self.seq:
                x = te.checkpoint(m, x)
            return x

    inputs = [torch.randn(4, 8, hidden, device=device) for _ in range(steps)]
    reference = _train(eager, "delayed", steps, inputs, inner_autocast=True)
    result = _train(Recompute(wrapped), "delayed", steps, inputs, inner_autocast=True)
    _assert_same(reference, result)


def test_dropout_masks_match_with_an_rng_tracker(device):
    hidden = 32
    tracker = te_dist.CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 1234)

    class TrackedDropout(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = te.Linear(hidden, hidden, device=device)

        def forward(self, x):
            with tracker.fork():
                x = torch.nn.functional.dropout(x, 0.5, training=True)
            return self.lin(x)

    torch.manual_seed(3)
    layer = TrackedDropout()
    x = torch.randn(4, hidden, device=device, requires_grad=True)
    states = tracker.get_states()
    (layer(x) ** 2).sum().backward()
    expected = (x.grad.clone(), layer.lin.weight.grad.clone())
    x.grad = None
    layer.lin.weight.grad = None
    layer.lin.bias.grad = None
    tracker.set_states(states)
    y = te.checkpoint(layer, x, get_rng_state_tracker=lambda: tracker)
    (y**2).sum().backward()
    torch.testing.assert_close(x.grad, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(layer.lin.weight.grad, expected[1], rtol=0, atol=0)


def test_recompute_phase_flags():
    seen = []

    def fn(x):
        seen.append((te_dist.is_fp8_activation_recompute_enabled(), te_dist.in_fp8_activation_recompute_phase()))
        return x * 2

    x = torch.randn(3, requires_grad=True)
    te.checkpoint(fn, x).sum().backward()
    assert seen == [(True, False), (False, True)]
    assert not te_dist.is_fp8_activation_recompute_enabled()
    assert not te_dist.in_fp8_activation_recompute_phase()


def test_kwargs_reach_the_function_and_legacy_form_warns():
    def fn(x, *, factor):
        return x * factor

    x = torch.randn(4, requires_grad=True)
    y = te.checkpoint(fn, x, factor=3.0, use_reentrant=False)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    with pytest.warns(DeprecationWarning, match="positionally"):
        te.checkpoint(lambda t: t + 1, False, None, None, x)


def test_rng_tracker_rules():
    tracker = te.CudaRNGStatesTracker()
    tracker.add("a", 7)
    with pytest.raises(ValueError, match="seed 7 already exists"):
        tracker.add("b", 7)
    with pytest.raises(ValueError, match="already exists"):
        tracker.add("a", 8)
    with pytest.raises(KeyError, match="not added"):
        with tracker.fork("missing"):
            pass
    # fork() advances the named state, not the default one.
    before = torch.get_rng_state() if not torch.cuda.is_available() else torch.cuda.get_rng_state()
    with tracker.fork("a"):
        first = torch.rand(4, device="cuda" if torch.cuda.is_available() else "cpu")
    with tracker.fork("a"):
        second = torch.rand(4, device="cuda" if torch.cuda.is_available() else "cpu")
    after = torch.get_rng_state() if not torch.cuda.is_available() else torch.cuda.get_rng_state()
    assert torch.equal(before, after)
    assert not torch.equal(first, second)
    tracker.reset()
    assert tracker.get_states() == {}


@pytest.mark.parametrize("kind", [None, *RECIPES])
def test_layernorm_mlp_checkpoint_is_identical_and_saves_less(device, kind):
    """LayerNormMLP(checkpoint=True): the same outputs, gradients and FP8 state
    as checkpoint=False over several steps, keeping only its input for backward."""
    hidden, steps = 64, 3
    torch.manual_seed(4)
    plain = torch.nn.Sequential(te.LayerNormMLP(hidden, 2 * hidden, activation="swiglu", device=device))
    ckpt = copy.deepcopy(plain)
    ckpt[0].checkpoint = True
    inputs = [torch.randn(4, 8, hidden, device=device) for _ in range(steps)]

    def train(model):
        if kind is None:
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            outs, grads = [], []
            for x in inputs:
                x = x.clone().requires_grad_(True)
                opt.zero_grad()
                y = model(x)
                (y**2).mean().backward()
                outs.append(y.detach().clone())
                grads.append([x.grad.clone()] + [p.grad.clone() for p in model.parameters()])
                opt.step()
            return outs, grads, []
        return _train(model, kind, steps, inputs)

    _assert_same(train(plain), train(ckpt))

    saved = []
    x = inputs[0].clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        ckpt(x)
    params = {p.data_ptr() for p in ckpt.parameters()}
    # (zero-element placeholders hold no memory)
    kept = [t for t in saved if t.numel() and t.data_ptr() not in params and t.data_ptr() != x.data_ptr()]
    assert kept == [], [tuple(t.shape) for t in kept]


class _ClientCheckpoint(torch.autograd.Function):
    """A client's own reentrant checkpoint (Megatron-Core's CheckpointFunction): the
    forward runs without grad inside activation_recompute_forward(True, False); the
    backward recomputes under the forward's recipe inside activation_recompute_forward(
    True, True) and back-propagates through the recomputed graph."""

    @staticmethod
    def forward(ctx, run, fp8_recipe, x):
        ctx.run, ctx.fp8_recipe = run, fp8_recipe
        ctx.save_for_backward(x)
        with torch.no_grad(), te_dist.activation_recompute_forward(activation_recompute=True, recompute_phase=False):
            assert te_dist.is_fp8_activation_recompute_enabled()
            return run(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        with torch.enable_grad(), te.autocast(recipe=ctx.fp8_recipe):
            with te_dist.activation_recompute_forward(activation_recompute=True, recompute_phase=True):
                assert te_dist.in_fp8_activation_recompute_phase()
                y = ctx.run(x)
        torch.autograd.backward(y, dy)
        return None, None, x.grad


@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_activation_recompute_forward_as_a_client_checkpoint_uses_it(kind):
    """Outputs, gradients and the delayed-scaling state after several steps equal the
    run that saves its activations, with two checkpointed blocks per step (their
    recomputes pair with their forwards in order)."""
    hidden, steps = 32, 3
    torch.manual_seed(3)
    eager = Model(hidden, 2, "cpu")
    client = copy.deepcopy(eager)
    fp8_recipe = RECIPES[kind]()

    def forward(x):
        for block in client.blocks:
            x = _ClientCheckpoint.apply(block, fp8_recipe, x)
        return x

    client.forward = forward
    inputs = [torch.randn(4, 8, hidden) for _ in range(steps)]
    reference = _train(eager, kind, steps, inputs)
    result = _train(client, kind, steps, inputs)
    _assert_same(reference, result)
    assert len(te_dist._AWAITING_RECOMPUTE) == 0  # every recorded forward met its recompute
    with te_dist.activation_recompute_forward(activation_recompute=True):  # (no FP8: the block runs unchanged)
        assert not te_dist.is_fp8_activation_recompute_enabled()


def test_recompute_phase_is_per_thread():
    """The recompute flag is the recomputing thread's, as the autocast state is."""
    import threading

    seen = []
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        with te_dist.activation_recompute_forward(activation_recompute=True, recompute_phase=True):
            assert te_dist.in_fp8_activation_recompute_phase()
            other = threading.Thread(target=lambda: seen.append(te_dist.in_fp8_activation_recompute_phase()))
            other.start()
            other.join()
    assert seen == [False] and not te_dist.in_fp8_activation_recompute_phase()
