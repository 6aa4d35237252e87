"""FP8 attention (a recipe with fp8_dpa=True or fp8_mha=True): the numerics of
the reference's FP8 fused attention, on the unfused backend.

Six per-tensor FP8 quantizations, in the reference's metadata slots of
DotProductAttention's FP8 state (forward: QKV 2, O 3, S 8; backward: dQKV 0,
dO 3, dP 5 -- the reference's META_* indices, so `core_attention._extra_state`
has its shape, 9 forward and 6 backward entries):

    forward   q, k, v -> FP8 (QKV quantizer, one scale for all three under
              delayed scaling); S = scale * q k^T + bias + mask in FP32;
              P = softmax(S), dropout; P -> FP8 (S quantizer) before P V;
              O = P V in FP32 -> FP8 (O quantizer), returned dequantized in
              the inputs' type.
    backward  dO -> FP8 (dO quantizer); dP = dO V^T, dV = P^T dO;
              dS = P * (dP - rowsum(P * dP)) -> FP8 (dP quantizer) before
              dS K and dS^T Q; dq, dk, dv -> FP8 (dQKV quantizer), returned
              dequantized.

Each quantization is te-core's (bytes equal to the FP8 cast kernels'), its
amax recorded where the recipe keeps it (delayed scaling: the amax history,
updated at the autocast's exit and after backward; current scaling: each
tensor's own scale). The matmuls run on the dequantized values in FP32: the
results are those of FP8 kernels that accumulate in FP32, at unfused speed.
Recipes: DelayedScaling and Float8CurrentScaling (per-tensor formats); the
block-scaled recipes' FP8 attention is not yet supported.
"""

from __future__ import annotations

import warnings

import torch

from ... import kernels
from ...quantization import FP8GlobalStateManager

# The reference's slots (tex.FP8FwdTensors / FP8BwdTensors values of META_*).
META_QKV, META_O, META_S = 2, 3, 8
META_DQKV, META_DO, META_DP = 0, 3, 5
NUM_GEMMS = 3  # DotProductAttention's FP8 state: 3 * 3 forward, 2 * 3 backward slots

_PER_TENSOR_RECIPES = ("DelayedScaling", "Float8CurrentScaling")
_warned = False


def requested() -> bool:
    """Whether the active autocast asks for FP8 attention (fp8_dpa or fp8_mha)."""
    s = FP8GlobalStateManager
    recipe = s.fp8_recipe
    if not s.fp8_enabled or recipe is None:
        return False
    return bool(getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False))


def check_recipe(owner: str) -> None:
    name = type(FP8GlobalStateManager.fp8_recipe).__name__
    if name not in _PER_TENSOR_RECIPES:
        raise NotImplementedError(
            f"{owner}: FP8 attention (fp8_dpa / fp8_mha) under {name} is not yet supported; it runs under "
            "DelayedScaling and Float8CurrentScaling (or set fp8_dpa=False and fp8_mha=False: the Linear layers "
            "still run in FP8, the attention in the inputs' precision)"
        )


def warn_once(owner: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"{owner}: FP8 attention runs the FP8 numerics on the unfused backend (materialized scores, "
            "FP32 matmuls): correct, but slower than BF16 attention until the cuDNN FP8 kernels are wired in",
            stacklevel=3,
        )


def _fake(x: torch.Tensor, quantizer) -> torch.Tensor:
    """x rounded through FP8 with `quantizer` (its amax / scale state updated), as x's type."""
    data, _, scale_inv = quantizer.quantize_parts(x.float().contiguous(), True, False)
    return kernels.dequantize_fp8(data, scale_inv, int(quantizer.dtype), out_dtype=torch.float32).to(x.dtype)


class Hooks:
    """The quantizers of one FP8 attention call, applied by the unfused backend
    at the six points of the module docstring."""

    def __init__(self, fwd_quantizers, bwd_quantizers, bwd_queue):
        self.qkv, self.o, self.s = (fwd_quantizers[i] for i in (META_QKV, META_O, META_S))
        self.dqkv, self.do, self.dp = (bwd_quantizers[i] for i in (META_DQKV, META_DO, META_DP))
        self.bwd_queue = bwd_queue

    def inputs(self, q, k, v):
        return _Inputs.apply(self, q, k, v)

    def probs(self, p):
        return _Probs.apply(self, p)

    def score_grad(self, s):
        return _ScoreGrad.apply(self, s)

    def output(self, o):
        return _Output.apply(self, o)


class _Inputs(torch.autograd.Function):
    """q, k, v through FP8 (QKV); their gradients through FP8 (dQKV)."""

    @staticmethod
    def forward(ctx, hooks, q, k, v):
        ctx.hooks = hooks
        return _fake(q, hooks.qkv), _fake(k, hooks.qkv), _fake(v, hooks.qkv)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        h = ctx.hooks
        grads = tuple(None if g is None else _fake(g, h.dqkv) for g in (dq, dk, dv))
        if h.bwd_queue is not None:  # (this module was the autocast region's first: its update runs here)
            h.bwd_queue.run()
        return (None, *grads)


class _Probs(torch.autograd.Function):
    """P through FP8 (S) before P V; the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, hooks, p):
        return _fake(p, hooks.s)

    @staticmethod
    def backward(ctx, grad):
        return None, grad


class _ScoreGrad(torch.autograd.Function):
    """Identity on S; dS through FP8 (dP) before dS K and dS^T Q."""

    @staticmethod
    def forward(ctx, hooks, s):
        ctx.hooks = hooks
        return s.view_as(s)

    @staticmethod
    def backward(ctx, grad):
        return None, _fake(grad, ctx.hooks.dp)


class _Output(torch.autograd.Function):
    """O through FP8 (O); dO through FP8 (dO)."""

    @staticmethod
    def forward(ctx, hooks, o):
        ctx.hooks = hooks
        return _fake(o, hooks.o)

    @staticmethod
    def backward(ctx, grad):
        return None, _fake(grad, ctx.hooks.do)
