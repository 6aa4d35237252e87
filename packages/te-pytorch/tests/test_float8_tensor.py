"""Float8Tensor and its quantizers: exact bytes, exact ops, fallback ops,
in-place requantization, serialization."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from pt_helpers import hostile

import transformer_engine.pytorch as te
from transformer_engine.core import reference

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.cast]

E4M3, E5M2 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2
FMT = {E4M3: "e4m3", E5M2: "e5m2"}
DIMS = [(), (7,), (5, 16), (3, 4, 32), (2, 3, 5, 16)]


def _oracle_values(x: torch.Tensor, scale: float, fmt: str) -> np.ndarray:
    # (1-D for the oracle: it expects arrays, not 0-d scalars.)
    q = reference.quantize_fp8(x.float().cpu().numpy().reshape(-1), scale, fmt)
    return reference.dequantize_fp8(q, np.float32(1) / np.float32(scale), fmt).reshape(x.shape)


def _delayed(device, scale=1.0, fp8_dtype=E4M3):
    return te.Float8Quantizer(torch.tensor([scale], device=device), torch.zeros(1, device=device), fp8_dtype)


@pytest.mark.parametrize("scale", [0.375, 1.0, 3.5])
@pytest.mark.parametrize("dims", DIMS)
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2])
def test_quantize_dequantize_delayed(device, scale, dims, fp8_dtype):
    x = hostile(dims, torch.float32, device, FMT[fp8_dtype])
    quantizer = _delayed(device, scale, fp8_dtype)
    t = quantizer(x)
    assert isinstance(t, te.Float8Tensor) and t.dtype == torch.float32 and t.shape == x.shape
    assert t._data.dtype == torch.uint8 and t._scale_inv.shape == (1,)
    expected = _oracle_values(x, scale, FMT[fp8_dtype])
    np.testing.assert_array_equal(t.dequantize().cpu().numpy(), expected)
    # amax is max-accumulated into the quantizer's buffer (NaN ignored).
    assert quantizer.amax.item() == reference.amax(x.cpu().numpy())


@pytest.mark.parametrize("dims", [(1, 16), (33, 17), (2, 3, 5, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_current_scaling_bit_exact(device, dims, dtype, pow2, eps):
    x = hostile(dims, dtype, device)
    quantizer = te.Float8CurrentScalingQuantizer(E4M3, device, force_pow_2_scales=pow2, amax_epsilon=eps)
    t = quantizer(x)
    amax = reference.amax(x.float().cpu().numpy())
    scale = reference.scale_from_amax(amax, "e4m3", pow2, eps, value_for_inf=torch.finfo(dtype).max)
    q = reference.quantize_fp8(x.float().cpu().numpy(), scale, "e4m3")
    np.testing.assert_array_equal(t._data.cpu().numpy(), q)
    np.testing.assert_array_equal(t._transpose.cpu().numpy(), reference.columnwise(q))
    assert t._scale_inv.item() == np.float32(1) / scale
    assert t.dtype == dtype


def test_constructor_and_columnwise_only(device):
    x = torch.randn(8, 32, device=device)
    full = te.Float8CurrentScalingQuantizer(E4M3, device)(x)
    t = te.Float8Tensor(full.shape, torch.bfloat16, full._data, full._scale_inv, E4M3)
    assert t.dtype == torch.bfloat16 and t._transpose is None and t._transpose_invalid
    only_col = te.Float8Tensor(full.shape, torch.float32, None, full._scale_inv, E4M3, data_transpose=full._transpose)
    assert torch.equal(only_col.dequantize(), full.dequantize())
    with pytest.raises(TypeError, match="fp8_dtype must be"):
        te.Float8Tensor(full.shape, torch.float32, full._data, full._scale_inv, te.DType.kFloat32)


def test_exact_ops(device):
    x = hostile((16, 32), torch.float32, device)
    t = te.Float8CurrentScalingQuantizer(E4M3, device)(x)
    value = t.dequantize()
    for op, expected in ((torch.neg, -value), (torch.abs, value.abs())):
        out = op(t)
        assert isinstance(out, te.Float8Tensor)
        torch.testing.assert_close(out.dequantize(), expected, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(out._transpose, out._data.t().contiguous())
    detached = t.detach()
    assert isinstance(detached, te.Float8Tensor) and detached._data is t._data
    same_rows = t.view(2, 8, 32)
    assert isinstance(same_rows, te.Float8Tensor) and same_rows._transpose is t._transpose
    other_rows = t.reshape(32, 16)
    assert isinstance(other_rows, te.Float8Tensor) and other_rows._transpose is None
    torch.testing.assert_close(other_rows.dequantize(), value.reshape(32, 16), rtol=0, atol=0, equal_nan=True)
    pieces = t.chunk(4)
    assert all(isinstance(p, te.Float8Tensor) and p.shape == (4, 32) for p in pieces)
    torch.testing.assert_close(torch.cat([p.dequantize() for p in pieces]), value, rtol=0, atol=0, equal_nan=True)
    clone = t.clone()
    assert clone._data.data_ptr() != t._data.data_ptr() and torch.equal(clone._data, t._data)


def test_fallback_ops_run_on_dequantized_values(device):
    x = torch.randn(16, 32, device=device)
    t = te.Float8CurrentScalingQuantizer(E4M3, device)(x)
    value = t.dequantize()
    y = torch.randn_like(x)
    for result, expected in (
        (t + y, value + y),
        (t * 3, value * 3),
        (torch.sin(t), value.sin()),
        (t @ y.T, value @ y.T),
        (t.sum(), value.sum()),
    ):
        assert type(result) is torch.Tensor
        assert torch.equal(result, expected)
    assert type(t.to(torch.bfloat16)) is torch.Tensor
    assert torch.equal(t.to(torch.bfloat16), value.to(torch.bfloat16))
    # The FP8 error against the unquantized input: E4M3, relative 2^-4 plus half a subnormal step.
    scale = 448.0 / x.abs().max().item()
    assert ((value - x).abs() <= 2.0**-4 * x.abs() + 2.0**-10 / scale).all()


def test_inplace_ops_requantize(device):
    x = torch.randn(16, 32, device=device)
    quantizer = te.Float8CurrentScalingQuantizer(E4M3, device)
    t = quantizer(x)
    data = t._data
    expected = quantizer(t.dequantize() + 1.0).dequantize()
    t.add_(1.0)
    assert isinstance(t, te.Float8Tensor) and t._data is data  # storage kept, values updated
    assert torch.equal(t.dequantize(), expected)
    src = torch.randn(16, 32, device=device)
    t.copy_(src)
    assert torch.equal(t.dequantize(), quantizer(src).dequantize())
    plain = torch.empty(16, 32, device=device)
    plain.copy_(t)
    assert torch.equal(plain, t.dequantize())


def test_quantize_noop_flag(device):
    quantizer = te.Float8CurrentScalingQuantizer(E4M3, device)
    t = quantizer(torch.randn(16, 32, device=device))
    before = t._data.clone()
    t.quantize_(torch.randn(16, 32, device=device), noop_flag=torch.ones(1, device=device))
    assert torch.equal(t._data, before)
    t.quantize_(torch.randn(16, 32, device=device), noop_flag=torch.zeros(1, device=device))
    assert not torch.equal(t._data, before)


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("current", [True, False])
def test_save_load_exact(device, weights_only, current):
    x = hostile((24, 48), torch.bfloat16, device)
    quantizer = te.Float8CurrentScalingQuantizer(E5M2, device) if current else _delayed(device, 0.25, E5M2)
    t = quantizer(x)
    t.requires_grad_(True)
    buffer = io.BytesIO()
    torch.save({"t": t}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=weights_only)["t"]
    assert isinstance(loaded, te.Float8Tensor) and loaded.dtype == torch.bfloat16
    assert loaded.requires_grad and loaded._fp8_dtype == E5M2 and loaded.device == t.device
    for name in ("_data", "_transpose", "_scale_inv"):
        assert torch.equal(getattr(loaded, name), getattr(t, name))
    assert type(loaded._quantizer) is type(quantizer)


def test_device_moves_keep_bytes(device):
    t = te.Float8CurrentScalingQuantizer(E4M3, device)(torch.randn(16, 32, device=device))
    moved = t.cpu()
    assert isinstance(moved, te.Float8Tensor) and moved.device.type == "cpu"
    assert torch.equal(moved._data, t._data.cpu()) and torch.equal(moved.dequantize(), t.dequantize().cpu())


def test_usage_make_empty_calibrate(device):
    quantizer = _delayed(device, 2.0)
    t = quantizer(torch.randn(16, 32, device=device))
    t.update_usage(rowwise_usage=False)
    assert t._data is None and t._transpose is not None
    quantizer.set_usage(columnwise=False)
    empty = quantizer.make_empty((4, 16), dtype=torch.bfloat16, device=device)
    assert empty.shape == (4, 16) and empty._transpose is None and empty.dtype == torch.bfloat16
    quantizer.amax.zero_()
    quantizer.calibrate(torch.tensor([[1.0, -7.5]], device=device))
    assert quantizer.amax.item() == 7.5


def test_quantize_autograd_is_straight_through(device):
    x = torch.randn(16, 32, device=device, requires_grad=True)
    t = te.Float8CurrentScalingQuantizer(E4M3, device)(x)
    (t.dequantize() * 2).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


def test_current_scaling_with_amax_reduction(gloo_world):
    """The all-reduce path (amax, reduce, scale, quantize) equals the fused one."""
    x = hostile((32, 64), torch.float32)
    fused = te.Float8CurrentScalingQuantizer(E4M3, "cpu")(x)
    reduced = te.Float8CurrentScalingQuantizer(E4M3, "cpu", with_amax_reduction=True, amax_reduction_group=gloo_world)(
        x
    )
    assert torch.equal(fused._data, reduced._data) and torch.equal(fused._transpose, reduced._transpose)
    assert torch.equal(fused._scale_inv, reduced._scale_inv)
