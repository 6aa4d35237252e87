"""te.ops: the norms against float64 torch, Sequential and the fuser (extra
inputs/outputs, the fusion registry), the parameter-free ops and the
collectives over gloo (one process, and two).
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import assert_within

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core.testing.tolerances import unit_roundoff
from transformer_engine.pytorch.ops.fuser import OperationFuser

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]


def _norm64(x, weight, bias, eps, zero_centered):
    g = weight + 1 if zero_centered else weight
    if bias is None:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * g
    mu = x.mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt((x - mu).square().mean(-1, keepdim=True) + eps) * g + bias


@pytest.mark.norm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norm_matches_float64(device, kind, dtype, zero_centered):
    op = getattr(te.ops, kind)(37, eps=1e-3, device=device, dtype=dtype, zero_centered_gamma=zero_centered)
    with torch.no_grad():
        for p in op.parameters():
            p.normal_()
    x = (torch.randn(3, 5, 37, device=device) * 2 + 1).to(dtype).requires_grad_()
    y = op(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    params = [p.detach().double().requires_grad_() for p in op.parameters()]
    x64 = x.detach().double().requires_grad_()
    bias = params[1] if kind == "LayerNorm" else None
    y64 = _norm64(x64, params[0], bias, 1e-3, zero_centered)
    y64.backward(dy.double())
    u = unit_roundoff(dtype)
    pairs = [(y, y64.detach(), "y"), (x.grad, x64.grad, "dx")] + [
        (p.grad, p64.grad, f"d{name}") for (name, p), p64 in zip(op.named_parameters(), params)
    ]
    for actual, expected, what in pairs:
        # (sums over rows and columns: a few roundings of the terms' magnitude)
        bound = 4 * u * expected.abs() + 64 * u * expected.abs().max() + 1e-6
        assert_within(actual, expected, bound, f"{kind} {what}")
    assert {k for k in op.state_dict()} == ({"weight", "bias"} if kind == "LayerNorm" else {"weight"}) | {
        "_extra_state"
    }


def test_megatron_residual_rmsnorm_pattern(device):
    """MakeExtraOutput + RMSNorm with a shared weight (Megatron-Core's fused
    residual RMSNorm): returns (normalized, residual), gradients flow through both."""
    module = te.RMSNorm(24, device=device)
    op = te.ops.RMSNorm(module.weight.shape, eps=module.eps, device="meta", dtype=module.weight.dtype, sm_margin={})
    op.weight = module.weight
    fused = te.ops.Sequential(te.ops.MakeExtraOutput(), op)
    x = torch.randn(4, 24, device=device, requires_grad=True)
    y, residual = fused(x)
    torch.testing.assert_close(y, module(x), rtol=0, atol=0)
    assert residual is not x and torch.equal(residual, x)
    (y.sum() + (residual * 2).sum()).backward()
    x_ref = x.detach().clone().requires_grad_()
    (module(x_ref).sum() + (x_ref * 2).sum()).backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_add_extra_input_and_sequential_extra_tensors(device):
    model = te.ops.Sequential(
        te.ops.ConstantScale(3.0),
        te.ops.AddExtraInput(),
        torch.nn.Tanh(),  # (a plain module between two fusers)
        te.ops.MakeExtraOutput(),
        te.ops.AddExtraInput(),
    )
    x, r1, r2 = (torch.randn(2, 5, device=device, requires_grad=True) for _ in range(3))
    y, mid = model(x, r1, r2)
    expected_mid = torch.tanh(3 * x + r1)
    torch.testing.assert_close(mid, expected_mid)
    torch.testing.assert_close(y, expected_mid + r2)
    (y.sum() + mid.square().sum()).backward()
    x64, a64, b64 = (t.detach().double().requires_grad_() for t in (x, r1, r2))
    m64 = torch.tanh(3 * x64 + a64)
    ((m64 + b64).sum() + m64.square().sum()).backward()
    for t, t64 in ((x, x64), (r1, a64), (r2, b64)):
        torch.testing.assert_close(t.grad.double(), t64.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Expected 1 extra inputs but got 0"):
        te.ops.AddExtraInput()(x)


def test_parameter_free_ops(device):
    x = torch.randn(2, 3, 8, device=device, requires_grad=True)
    model = te.ops.Sequential(te.ops.Identity(), te.ops.Reshape((6, -1)), te.ops.ConstantScale(-0.5))
    y = model(x)
    assert y.shape == (6, 8)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(y, -0.5 * x.detach().reshape(6, 8))
    torch.testing.assert_close(x.grad, torch.full_like(x, -0.5))
    l2 = te.ops.L2Normalization(eps=1e-6)
    x.grad = None
    y = l2(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    y64 = x64 * torch.rsqrt(x64.square().sum(-1, keepdim=True) + 1e-6)
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)


def test_dropout(device):
    op = te.ops.Dropout(0.25)
    x = torch.randn(40, 50, device=device, requires_grad=True)
    y = op(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], x.detach()[kept] / 0.75)
    assert 0.6 < kept.float().mean() < 0.9
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, kept.float() / 0.75)
    op.eval()
    assert op(x) is x or torch.equal(op(x), x)


@pytest.mark.parametrize(
    "make, tensor_type",
    [(recipe.Float8CurrentScaling, te.Float8Tensor), (recipe.MXFP8BlockScaling, te.MXFP8Tensor)],
)
def test_quantize(device, make, tensor_type):
    op = te.ops.Quantize(forward=True, backward=True)
    x = torch.randn(32, 64, device=device, requires_grad=True)
    assert op(x) is x or torch.equal(op(x), x)  # identity outside te.autocast
    with te.autocast(recipe=make()):
        y = op(x)
    assert isinstance(y, tensor_type)
    torch.testing.assert_close(y.dequantize(), x.detach(), rtol=0.07, atol=1e-2)
    # The next op takes the quantized tensor as its input.
    z = te.ops.Sequential(te.ops.Quantize(), te.ops.BasicLinear(64, 32, device=device))
    with te.autocast(recipe=make()):
        out = z(x)
    out.sum().backward()
    assert out.shape == (32, 32) and x.grad is not None


def test_fusion_registry():
    calls = []

    class ScaleThenScale(te.ops.FusedOperation):
        def fuser_forward(self, basic_op_ctxs, input_, **kwargs):
            calls.append("forward")
            a, b = self.basic_ops
            return input_ * (a.scale * b.scale), [(), ()]

    def fuse(ops, *, recipe=None):
        if len(ops) == 2 and all(isinstance(op, te.ops.ConstantScale) for op in ops):
            return [ScaleThenScale(ops)]
        return ops

    saved = list(OperationFuser.forward_fusion_functions)
    try:
        te.ops.register_forward_fusion(fuse, prepend=True)
        model = te.ops.Sequential(te.ops.ConstantScale(2.0), te.ops.ConstantScale(5.0))
        x = torch.randn(3, requires_grad=True)
        y = model(x)
        y.sum().backward()
        assert calls == ["forward"]
        torch.testing.assert_close(y, 10 * x.detach())
        torch.testing.assert_close(x.grad, torch.full_like(x, 10.0))  # (the unfused backward)
        with pytest.raises(TypeError, match="callable"):
            te.ops.register_backward_fusion(None)
    finally:
        OperationFuser.forward_fusion_functions[:] = saved


def test_sequential_container_api(device):
    a, b, c = te.ops.Identity(), torch.nn.ReLU(), te.ops.ConstantScale(2.0)
    model = te.ops.Sequential(a, b)
    model.append(c)
    assert len(model) == 3 and list(model) == [a, b, c] and model[-1] is c
    model.insert(0, te.ops.ConstantScale(-1.0))
    assert isinstance(model[1:], te.ops.Sequential) and len(model[1:]) == 3
    popped = model.pop(0)
    assert isinstance(popped, te.ops.ConstantScale) and list(model) == [a, b, c]
    x = torch.randn(4, device=device)
    torch.testing.assert_close(model(x), 2 * torch.relu(x))
    with pytest.raises(NotImplementedError, match="channels"):
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "res")


def test_collectives_over_one_process(gloo_world):
    x = torch.randn(4, 3, requires_grad=True)
    for op in (te.ops.AllReduce(), te.ops.AllGather(), te.ops.ReduceScatter()):
        y = op(x)
        torch.testing.assert_close(y, x.detach())
    layer = te.ops.Linear(3, 2, device="cpu", tensor_parallel_mode="column")  # one rank: no parallelism
    assert layer.basic_ops[0].tensor_parallel_mode is None


def _two_process_worker(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(rank)
    x = torch.randn(4, 3, requires_grad=True)
    results = {}
    for name in ("AllReduce", "AllGather", "ReduceScatter"):
        x.grad = None
        y = getattr(te.ops, name)()(x)
        y.backward(torch.full_like(y, float(rank + 1)))
        results[name] = (x.detach(), y.detach(), x.grad.clone())
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


def test_collectives_over_two_processes(tmp_path):
    # (fork: the workers run only torch collectives, no te-core kernel, and start in
    # milliseconds instead of re-importing torch)
    mp = torch.multiprocessing.get_context("fork")
    out = str(tmp_path / "result")
    procs = [mp.Process(target=_two_process_worker, args=(r, str(tmp_path / "store"), out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(100)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    r = [torch.load(f"{out}.{i}") for i in range(2)]
    x0, x1 = r[0]["AllReduce"][0], r[1]["AllReduce"][0]
    torch.testing.assert_close(r[0]["AllReduce"][1], x0 + x1)
    torch.testing.assert_close(r[1]["AllReduce"][2], torch.full_like(x1, 2.0))  # identity backward
    torch.testing.assert_close(r[0]["AllGather"][1], torch.cat([x0, x1]))
    torch.testing.assert_close(r[1]["AllGather"][2], torch.full_like(x1, 3.0))  # reduce-scatter of 1 + 2
    torch.testing.assert_close(r[0]["ReduceScatter"][1], (x0 + x1)[:2])
    torch.testing.assert_close(r[1]["ReduceScatter"][1], (x0 + x1)[2:])
    torch.testing.assert_close(r[0]["ReduceScatter"][2], torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)]))
