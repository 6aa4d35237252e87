"""Float64 torch references of LayerNormLinear and LayerNormMLP (plain torch,
autograd for the gradients) and the error bounds their tests share.

Formulas: reference §2.8. Norms: LayerNorm (x - E[x]) / sqrt(Var[x] + eps) g + b,
RMSNorm x / sqrt(mean(x^2) + eps) g, g = 1 + weight under zero_centered_gamma.
Activations: gelu is the tanh approximation; gated kinds act on the first
half and multiply by the second (clamped_swiglu clamps both).
"""

from __future__ import annotations

import math

import torch
from pt_helpers import UNIT_ROUNDOFF, fp8_error

import transformer_engine.pytorch as te
from transformer_engine.core.testing.tolerances import unit_roundoffs

U_OUT = unit_roundoffs(torch.float32, torch.bfloat16)
# Largest |f'| of the activations (gelu-tanh 1.13, silu 1.10, qgelu 1.09, relu 1)
# on inputs |x| <= 1 where srelu's 2x applies: the tests' h stay well within ±50,
# so srelu is not used with these bounds.
ACT_LIPSCHITZ = 1.13


def norm64(x, weight, bias, eps, zero_centered_gamma, rms: bool):
    x = x.double()
    g = weight.double() + (1.0 if zero_centered_gamma else 0.0)
    if rms:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps) * g + bias.double()


def _base(name: str, a, limit=7.0, alpha=1.702):
    if name in ("gelu", "geglu"):
        return 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
    if name in ("relu", "reglu"):
        return torch.relu(a)
    if name in ("silu", "swiglu"):
        return a * torch.sigmoid(a)
    if name in ("qgelu", "qgeglu"):
        return a * torch.sigmoid(1.702 * a)
    if name in ("srelu", "sreglu"):
        return torch.relu(a) ** 2
    if name == "glu":
        return torch.sigmoid(a)
    c = torch.clamp(a, max=limit)  # clamped_swiglu
    return c * torch.sigmoid(alpha * c)


def act64(h, kind: str, limit=7.0, alpha=1.702, glu_linear_offset=1.0):
    if kind in ("gelu", "relu", "silu", "qgelu", "srelu"):
        return _base(kind, h)
    a, b = h.chunk(2, dim=-1)
    if kind == "clamped_swiglu":
        return _base(kind, a, limit, alpha) * (torch.clamp(b, -limit, limit) + glu_linear_offset)
    return _base(kind, a) * b


def params64(module):
    """float64 leaf copies of the module's parameters, by name."""
    return {n: p.detach().double().requires_grad_() for n, p in module.named_parameters()}


def layernorm_mlp64(x, p, *, eps, zero_centered_gamma, rms, kind, act_params=None):
    """(out, ln, h, act) of LayerNormMLP in float64."""
    ln = norm64(x, p["layer_norm_weight"], p.get("layer_norm_bias"), eps, zero_centered_gamma, rms)
    h = ln @ p["fc1_weight"].T + (p["fc1_bias"] if "fc1_bias" in p else 0)
    act = act64(h, kind, **(act_params or {}))
    out = act @ p["fc2_weight"].T + (p["fc2_bias"] if "fc2_bias" in p else 0)
    return out, ln, h, act


def fp8_ln_error(ln, scale, dtype):
    """Bound of |FP8(ln) - ln|: the norm's FP32 result (2^-20 relative, a few
    ulps), rounded to dtype when the quantization reads the high-precision
    output (current scaling), then quantized to E4M3 with `scale`."""
    hp = (2.0**-20 + U_OUT[dtype]) * ln.abs()
    return hp + fp8_error(ln.abs() + hp, "e4m3", scale)


def run_module(layer, x, dy, fp8_recipe=None, **kwargs):
    """(forward result, dx) of one step of `layer` under `fp8_recipe` (None: high precision)."""
    x = x.detach().clone().requires_grad_()
    layer.zero_grad(set_to_none=True)
    with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
        out = layer(x, **kwargs)
    y = out[0] if isinstance(out, tuple) else out
    y.backward(dy)
    return out, x.grad


def rel_norm_error(actual, expected) -> float:
    expected = expected.double()
    return ((actual.double() - expected).norm() / expected.norm()).item()


# Norm-wise bound of an FP8 gradient: each FP8 operand on its path perturbs
# elementwise by at most its unit roundoff (E4M3 2^-4, E5M2 2^-3); the sum of
# those along the path, doubled for cancellation in the products and sums.
def fp8_grad_bound(n_e4m3: int, n_e5m2: int) -> float:
    return 2 * (n_e4m3 * UNIT_ROUNDOFF["e4m3"] + n_e5m2 * UNIT_ROUNDOFF["e5m2"])
