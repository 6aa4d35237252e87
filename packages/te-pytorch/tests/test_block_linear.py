"""te.Linear under the block-scaled recipes against float64 torch.

Bounds (pt_helpers.matmul_bound, elementwise) come from each operand's
quantization error bound e(t), derived from the formats' precision with
A = max|t| of the tensor (an upper bound of every block's amax):

- MXFP8 / FP8 block (E4M3, power-of-2 block scales): each block's scale
  inverse is at most 2 * amax_block / 448 (MXFP8 rounds the exponent up; FP8
  block rounds the scale down), so no element saturates and e(t) = 2^-4 |t|
  + half an E4M3 subnormal step (2^-10) times 2 A / 448: fp8_error(t, "e4m3",
  448 / (2 A)).
- NVFP4: a block's values are scaled by enc_b = 1 / (s_b S_dec) into E2M1's
  range (magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6). Nearest rounding there errs by
  at most |v|/4 + 1/4 (half a spacing: 1/4 below 2, 1/2 up to 4, 1 up to 6; also
  covers the saturation when s_b rounds down by E4M3's 2^-4); stochastic
  rounding by less than one spacing, |v|/2 + 1/2. Back in x's units (divide
  by enc_b), with s_b S_dec <= A/6 (1 + 2^-4) + 2^-10 A / 2688 <= A / 5.6:
      nearest  e(t) = |t|/4 + A/22.4     stochastic  e(t) = |t|/2 + A/11.2
  The RHT'd wgrad operands are bounded in the transformed basis (the GEMM
  computes (dY^T H)(H^T X)), with A their post-RHT amax.
On CUDA the emulated GEMM rounds dequantized operands to BF16 (exact for
MXFP8 and power-of-2 FP8 block values, a relative 2^-8 for NVFP4), and the
native FP8-block GEMM accumulates like te_gemm's FP8 path (accumulation_u).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from pt_helpers import accumulation_u, assert_within, fp8_error, matmul_bound

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core.nvfp4 import RHT_SIGN_MASK
from transformer_engine.core.testing.tolerances import unit_roundoffs
from transformer_engine.pytorch.module import _operand

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.module]

U_OUT = unit_roundoffs(torch.float32, torch.bfloat16)
RECIPES = {
    "mxfp8": recipe.MXFP8BlockScaling,
    "fp8_block": recipe.Float8BlockScaling,
    "nvfp4": recipe.NVFP4BlockScaling,
}


def _fp8_err(t):
    return fp8_error(t, "e4m3", 448.0 / (2 * t.abs().max().item()))


def _fp4_err(t, stochastic, device):
    a = t.abs().max().item()
    err = t.abs() / 2 + a / 11.2 if stochastic else t.abs() / 4 + a / 22.4
    if device.type == "cuda":  # the emulated GEMM's BF16 operands
        err = err + 2.0**-8 * (t.abs() + err)
    return err


def _hadamard(device) -> torch.Tensor:
    """H = (1/4) diag(S) H16, the NVFP4 RHT (core/include/te/nvfp4.h), float64."""
    i = torch.arange(16)
    both = i[:, None] & i[None, :]
    h16 = 1.0 - 2.0 * (sum((both >> b) & 1 for b in range(4)) % 2)
    signs = 1.0 - 2.0 * ((RHT_SIGN_MASK >> i) & 1)
    return (signs[:, None] * h16 / 4).double().to(device)


def _rht_rows(t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Each column's 16-row blocks v -> v H: t [T, F] -> (H^T-blocked) [T, F]."""
    rows, cols = t.shape
    return (t.T.reshape(cols, rows // 16, 16) @ h).reshape(cols, rows).T


def _run(layer, x, dy, fp8_recipe):
    x = x.detach().clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with te.autocast(recipe=fp8_recipe):
        y = layer(x)
    y.backward(dy)
    return y, x.grad


@pytest.mark.parametrize("kind", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_recipe_matches_float64_within_format_bounds(device, kind, dtype):
    tokens, n_in, n_out = 128, 256, 128
    layer = te.Linear(n_in, n_out, params_dtype=dtype, device=device)
    with torch.no_grad():
        layer.bias.normal_()
    x = (torch.randn(2, tokens // 2, n_in, device=device) * 3).to(dtype)
    dy = torch.randn(2, tokens // 2, n_out, device=device).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y, dx = _run(layer, x, dy, RECIPES[kind]())
    x2, w, dy2 = x.reshape(-1, n_in).double(), layer.weight.double(), dy.reshape(-1, n_out).double()
    acc_u = accumulation_u(device, True)
    b = layer.bias.double()
    if kind == "nvfp4":
        # fprop: x, W nearest; dgrad: dy stochastic, W nearest (2-D); wgrad: RHT'd dy (stochastic), x (nearest).
        h = _hadamard(device)
        e_x, e_w, e_dy = _fp4_err(x2, False, device), _fp4_err(w, False, device), _fp4_err(dy2, True, device)
        dy_h, x_h = _rht_rows(dy2, h), _rht_rows(x2, h)
        e_dyh, e_xh = _fp4_err(dy_h, True, device), _fp4_err(x_h, False, device)
        wgrad_bound = matmul_bound(dy_h.T, x_h.T, e_dyh.T, e_xh.T, dtype, acc_u)
    else:
        e_x, e_w, e_dy = _fp8_err(x2), _fp8_err(w), _fp8_err(dy2)
        wgrad_bound = matmul_bound(dy2.T, x2.T, e_dy.T, e_x.T, dtype, acc_u)
    y_bound = matmul_bound(x2, w, e_x, e_w, dtype, acc_u) + U_OUT[dtype] * b.abs()
    assert_within(y.reshape(-1, n_out), x2 @ w.T + b, y_bound, f"{kind} y")
    assert_within(dx.reshape(-1, n_in), dy2 @ w, matmul_bound(dy2, w.T, e_dy, e_w.T, dtype, acc_u), f"{kind} dx")
    assert_within(layer.weight.grad, dy2.T @ x2, wgrad_bound, f"{kind} dW")
    db_bound = 50 * 2.0**-24 * dy2.abs().sum(0) + U_OUT[dtype] * dy2.sum(0).abs()
    assert_within(layer.bias.grad, dy2.sum(0), db_bound, "db")


@pytest.mark.parametrize("kind", list(RECIPES))
def test_backward_saves_quantized_activations_only(kind):
    layer = te.Linear(64, 32, device="cpu")
    x = torch.randn(32, 64, requires_grad=True)
    saved = []
    with (
        warnings.catch_warnings(),
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
        te.autocast(recipe=RECIPES[kind]()),
    ):
        warnings.simplefilter("ignore")
        layer(x)
    assert saved
    # Quantized bytes (uint8) and FP32 block scales / amaxes; never x itself.
    assert all(t.dtype in (torch.uint8, torch.float32) for t in saved)
    assert not any(t.shape == x.shape and t.dtype == torch.float32 for t in saved)


@pytest.mark.parametrize("kind", ["mxfp8", "nvfp4"])
def test_emulation_warns_once(kind):
    _operand._WARNED.discard(kind)
    layer = te.Linear(64, 32, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(32, 64, requires_grad=True)
            with te.autocast(recipe=RECIPES[kind]()):
                layer(x).sum().backward()
    emulated = [w for w in caught if "GEMM is emulated by dequantizing" in str(w.message)]
    assert len(emulated) == 1, [str(w.message) for w in caught]
    assert "no native" in str(emulated[0].message)


@pytest.mark.parametrize(
    "kind, shape, multiple",
    [("mxfp8", (48, 64), 32), ("mxfp8", (32, 80), 32), ("nvfp4", (32, 48), 32), ("fp8_block", (24, 64), 16)],
)
def test_bad_shapes_name_the_dims_and_the_padding(kind, shape, multiple):
    tokens, n_in = shape
    layer = te.Linear(n_in, 64, device="cpu")
    with (
        pytest.raises(
            ValueError,
            match=rf"by {multiple} and out_features by {multiple}, got tokens={tokens}, in_features={n_in}.*Pad",
        ),
        te.autocast(recipe=RECIPES[kind]()),
    ):
        layer(torch.randn(tokens, n_in))


def test_float8_block_recipe_builds_its_block_shapes():
    layer = te.Linear(128, 128, device="cpu")
    with warnings.catch_warnings(), te.autocast(recipe=recipe.Float8BlockScaling()):
        warnings.simplefilter("ignore")
        layer(torch.randn(128, 128))
    fwd, bwd = layer.quantizers["scaling_fwd"], layer.quantizers["scaling_bwd"]
    assert [q.block_scaling_dim for q in fwd] == [1, 2, 1] and bwd[0].block_scaling_dim == 1
    assert all(q.force_pow_2_scales for q in fwd + bwd)


def test_nvfp4_recipe_follows_its_fields():
    layer = te.Linear(64, 64, device="cpu")
    with warnings.catch_warnings(), te.autocast(recipe=recipe.NVFP4BlockScaling()):
        warnings.simplefilter("ignore")
        layer(torch.randn(64, 64))
    inp, weight, _ = layer.quantizers["scaling_fwd"]
    grad = layer.quantizers["scaling_bwd"][0]
    assert inp.with_rht and not inp.stochastic_rounding and not inp.with_2d_quantization
    assert weight.with_2d_quantization and not weight.with_rht and not weight.stochastic_rounding
    assert grad.with_rht and grad.stochastic_rounding
    r = recipe.NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True)
    with warnings.catch_warnings(), te.autocast(recipe=r):
        warnings.simplefilter("ignore")
        layer(torch.randn(64, 64))
    qs = layer.quantizers["scaling_fwd"] + layer.quantizers["scaling_bwd"]
    assert not any(q.with_rht or q.stochastic_rounding or q.with_2d_quantization for q in qs)


@pytest.mark.parametrize("kind", list(RECIPES))
def test_fused_wgrad_accumulation(device, kind):
    layer = te.Linear(64, 64, fuse_wgrad_accumulation=True, device=device)
    layer.weight.main_grad = torch.ones(64, 64, device=device)
    x = torch.randn(64, 64, device=device, requires_grad=True)
    dy = torch.randn(64, 64, device=device)
    with warnings.catch_warnings(), te.autocast(recipe=RECIPES[kind]()):
        warnings.simplefilter("ignore")
        y = layer(x)
    y.backward(dy)
    assert layer.weight.grad is None
    reference = dy.double().T @ x.detach().double() + 1
    rel = (layer.weight.main_grad.double() - reference).norm() / reference.norm()
    assert rel < 0.5  # the GEMM ran into main_grad (its accuracy is tested above)
