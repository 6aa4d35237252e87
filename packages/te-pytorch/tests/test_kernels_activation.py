"""torch.ops.te.activation_fwd / activation_bwd (/ activation_bwd_fwd_columnwise): the torch wrappers against
te-core's NumPy API (the same formulas, checked element by element against a
float64 oracle in te-core's own tests: here the plumbing must give the same
bytes, on the CPU and on CUDA) and, norm-wise, against the float64 oracle
(transformer_engine.core.reference_activation) to catch a wrong kind or
swapped halves: FP32 evaluation is within 2^-16 of it relative to the norm
(a few dozen ulps), plus the output rounding (2^-8 for BF16). Fused FP8
outputs must equal, byte for byte, quantize_fp8 of the FP32 output
(activation.h: "quantized exactly as te_quantize_fp8 would quantize an FP32
tensor of the values").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_engine.core import activation as core_activation
from transformer_engine.core import reference_activation as oracle
from transformer_engine.core.activation import ACTIVATIONS
from transformer_engine.core.testing.tolerances import unit_roundoffs
from transformer_engine.pytorch import kernels

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.activation]

U = unit_roundoffs(torch.float32, torch.bfloat16, torch.float16)
E4M3, E5M2 = 7, 8


def _close_in_norm(actual, expected, out_dtype):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    err = (actual.double().cpu() - expected).norm()
    assert err <= (2.0**-16 + U[out_dtype]) * expected.norm() + 1e-30, err.item()


@pytest.mark.parametrize("kind", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_backward_match_the_core_and_the_oracle(device, kind, dtype):
    x = (torch.randn(5, 48) * 3).to(dtype).to(device)
    y = kernels.activation_fwd(x, kind)[0]
    x64 = x.double().cpu().numpy()
    _close_in_norm(y, oracle.forward(x64, kind), dtype)
    grad = torch.randn(y.shape).to(dtype).to(device)
    dx, _, _, dbias = kernels.activation_bwd(grad, x, kind, dbias=True)
    _close_in_norm(dx, oracle.backward(grad.double().cpu().numpy(), x64, kind), dtype)
    if dtype == torch.float32:  # the same bytes as te-core's NumPy API
        x32, g32 = x.cpu().numpy(), grad.cpu().numpy()
        assert np.array_equal(y.cpu().numpy(), core_activation.activation_forward(x32, kind), equal_nan=True)
        ref = core_activation.activation_backward(g32, x32, kind, dbias=True)
        assert np.array_equal(dx.cpu().numpy(), ref.grad_input, equal_nan=True)
        assert np.array_equal(dbias.cpu().numpy(), ref.dbias, equal_nan=True)


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "srelu", "clamped_swiglu"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2])
def test_fused_fp8_outputs_equal_the_separate_quantize(device, kind, fp8_dtype):
    x = (torch.randn(32, 64) * 4).to(torch.bfloat16).to(device)
    scale = torch.tensor([3.0], device=device)
    amax = torch.zeros(1, device=device)
    row, col, scale_inv = kernels.activation_fwd(
        x, kind, fp8_dtype=fp8_dtype, scale=scale, amax=amax, rowwise=True, columnwise=True
    )
    v = kernels.activation_fwd(x, kind, out_dtype=torch.float32)[0]
    ref_row, ref_col, ref_sinv = kernels.quantize_fp8(v, scale, None, fp8_dtype, True, True)
    assert torch.equal(row, ref_row) and torch.equal(col, ref_col) and torch.equal(scale_inv, ref_sinv)
    assert amax.item() == v.abs().max().item()
    # Backward: FP8 grad_input (both copies) and dbias in one call.
    grad = torch.randn(v.shape).to(torch.bfloat16).to(device)
    g_row, g_col, _, dbias = kernels.activation_bwd(
        grad, x, kind, fp8_dtype=fp8_dtype, scale=scale, rowwise=True, columnwise=True, dbias=True
    )
    dv, _, _, dbias_hp = kernels.activation_bwd(grad, x, kind, out_dtype=torch.float32, dbias=True)
    ref_row, ref_col, _ = kernels.quantize_fp8(dv, scale, None, fp8_dtype, True, True)
    assert torch.equal(g_row, ref_row) and torch.equal(g_col, ref_col)
    assert torch.equal(dbias, dbias_hp)


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "clamped_swiglu"])
@pytest.mark.parametrize("grad_fp8", [True, False], ids=["fp8-grad", "bf16-grad"])
@pytest.mark.parametrize("fwd_dtype", [E4M3, E5M2])
@pytest.mark.parametrize("values", [torch.float32, torch.bfloat16], ids=["fp32-values", "bf16-values"])
def test_backward_with_the_forward_columnwise_copy(device, kind, grad_fp8, fwd_dtype, values):
    """activation_bwd_fwd_columnwise: activation_bwd's outputs plus the bytes of
    activation_fwd(columnwise only) with the given scale (FP32 values), or of
    quantize_fp8 of the BF16 forward output (BF16 values), from one call."""
    x = (torch.randn(130, 96) * 4).to(torch.bfloat16).to(device)
    grad = torch.randn(kernels.activation_fwd(x, kind)[0].shape).to(torch.bfloat16).to(device)
    fwd_scale = torch.tensor([0.75], device=device)
    kw = {"fp8_dtype": E4M3, "scale": torch.tensor([2.0], device=device), "columnwise": True} if grad_fp8 else {}
    amax_f, amax_s = torch.zeros(1, device=device), torch.zeros(1, device=device)
    *fused, col, scale_inv = kernels.activation_bwd_fwd_columnwise(
        grad,
        x,
        kind,
        fwd_fp8_dtype=fwd_dtype,
        fwd_scale=fwd_scale,
        fwd_values_dtype=values,
        amax=amax_f,
        dbias=True,
        **kw,
    )
    separate = kernels.activation_bwd(grad, x, kind, amax=amax_s, dbias=True, **kw)
    for got, want in zip(fused, separate, strict=True):
        assert (got is None and want is None) or torch.equal(got, want)
    assert torch.equal(amax_f, amax_s)
    if values == torch.float32:
        _, ref_col, ref_scale_inv = kernels.activation_fwd(
            x, kind, fp8_dtype=fwd_dtype, scale=fwd_scale, rowwise=False, columnwise=True
        )
    else:
        y = kernels.activation_fwd(x, kind, out_dtype=values)[0]
        _, ref_col, ref_scale_inv = kernels.quantize_fp8(y, fwd_scale, None, fwd_dtype, False, True)
    assert torch.equal(col, ref_col) and torch.equal(scale_inv, ref_scale_inv)


def test_low_precision_output_is_the_rounded_fp32_output():
    x = torch.randn(16, 64) * 2
    for kind in ("geglu", "qgelu"):
        v = kernels.activation_fwd(x, kind)[0]
        for dtype in (torch.bfloat16, torch.float16):
            y = kernels.activation_fwd(x, kind, out_dtype=dtype)[0]
            assert torch.equal(y, v.to(dtype))


def test_clamped_swiglu_parameters():
    x = torch.randn(8, 32) * 10
    p = {"limit": 3.0, "alpha": 1.5, "glu_linear_offset": 0.5}
    y = kernels.activation_fwd(x, "clamped_swiglu", **p)[0]
    _close_in_norm(y, oracle.forward(x.double().numpy(), "clamped_swiglu", **p), torch.float32)
    assert np.array_equal(y.numpy(), core_activation.activation_forward(x.numpy(), "clamped_swiglu", **p))


def test_errors_name_the_argument():
    x = torch.randn(16, 32)
    with pytest.raises(ValueError, match="needs the input's last dim to be even"):
        kernels.activation_fwd(torch.randn(4, 7), "swiglu")
    with pytest.raises(ValueError, match="argument 'scale' is required"):
        kernels.activation_fwd(x, "gelu", fp8_dtype=E4M3)
    with pytest.raises(ValueError, match="columnwise output needs an FP8 output"):
        kernels.activation_fwd(x, "gelu", columnwise=True)
    with pytest.raises(TypeError, match="argument 'x' must be float32, bfloat16 or float16"):
        kernels.activation_fwd(x.double(), "gelu")
    with pytest.raises(ValueError, match="argument 'dy' must have the forward output's shape"):
        kernels.activation_bwd(torch.randn(16, 32), x, "swiglu")
    with pytest.raises(ValueError, match="needs an FP8 'fwd_fp8_dtype' and 'fwd_scale'"):
        kernels.activation_bwd_fwd_columnwise(torch.randn(16, 16), x, "swiglu", fwd_fp8_dtype=E4M3, fwd_scale=None)
