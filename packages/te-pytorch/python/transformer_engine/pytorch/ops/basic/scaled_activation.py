"""Activations with per-row post-scaling (the middle op of a grouped MoE MLP):
out = act(x) * scales[..., None], the scales an extra input of shape
out.shape[:-1]. act runs on te-core's kernels (activation.py / swiglu.py);
the scaling and the scales' gradient sum(dy * act(x), -1) are torch ops.
"""

from __future__ import annotations

from transformer_engine.core.activation import DEFAULT_PARAMS

from .._common import compute_dtype, maybe_dequantize
from ..op import BasicOperation
from .activation import SReLU
from .swiglu import ClampedSwiGLU, SwiGLU

__all__ = ["ScaledClampedQGeGLU", "ScaledSReLU", "ScaledSiTUGLU", "ScaledSwiGLU", "ScaledTanhSReLU"]


class _ScaledActivation(BasicOperation):
    """act(x) * scales[..., None]; `self._act` is the activation op that computes act."""

    num_extra_inputs = 1

    def __init__(self, act, activation_recompute_in_mlp: bool) -> None:
        super().__init__()
        if activation_recompute_in_mlp:
            raise NotImplementedError(
                f"te.ops.{type(self).__name__}: activation_recompute_in_mlp=True (the fused grouped MLP's "
                "recompute) is not yet supported by transformer_engine.pytorch.ops"
            )
        self.activation_recompute_in_mlp = False
        self._act = (act,)  # (a tuple: not a registered submodule, no state_dict entry)

    def op_forward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} has an extra tensor input: it overrides `fuser_forward`")

    def op_backward(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} has an extra tensor input: it overrides `fuser_backward`")

    def fuser_forward(
        self,
        basic_op_ctxs,
        input_,
        *,
        basic_op_extra_inputs,
        prev_op_grad_output_quantizer,
        next_op_input_quantizer,
        basic_op_kwargs,
    ):
        (act,) = self._act
        scales_in = basic_op_extra_inputs[0][0]
        dtype = compute_dtype(input_, input_.dtype)
        x = act._to_kernel_layout(maybe_dequantize(input_, dtype).contiguous())
        scales = maybe_dequantize(scales_in, dtype)
        y = act.activation_forward(x)
        if tuple(scales.shape) != tuple(y.shape[:-1]):
            raise ValueError(
                f"te.ops.{type(self).__name__}: the scales must have the output's leading shape "
                f"{tuple(y.shape[:-1])}, got {tuple(scales.shape)}"
            )
        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            ctx.save_for_backward(x, scales)
            ctx.dtype = dtype
            ctx.scales_requires_grad = scales_in.requires_grad
            ctx.scales_dtype = scales_in.dtype
        return y * scales.unsqueeze(-1), [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        (act,) = self._act
        ctx = basic_op_ctxs[0]
        x, scales = ctx.saved_tensors
        dy = maybe_dequantize(grad_output, ctx.dtype)
        dx, _ = act.activation_backward((dy * scales.unsqueeze(-1)).contiguous(), x)
        dscales = None
        if ctx.scales_requires_grad:
            y = act.activation_forward(x)
            dscales = (dy.float() * y.float()).sum(-1).to(ctx.scales_dtype)
        return act._from_kernel_layout(dx), [()], [(dscales,)]


class ScaledSReLU(_ScaledActivation):
    """Squared ReLU with per-row post-scaling (extra input: the scales).

    Args:
        activation_recompute_in_mlp: bool, default = False. Must be False (the fused grouped MLP's recompute is not
            supported yet).
    """

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__(SReLU(), activation_recompute_in_mlp)


class ScaledSwiGLU(_ScaledActivation):
    """SwiGLU with per-row post-scaling (extra input: the scales).

    Args:
        glu_interleave_size: int, optional. Block-interleaved GLU layout, as in SwiGLU.
        activation_recompute_in_mlp: bool, default = False. Must be False.
    """

    def __init__(self, glu_interleave_size: int | None = None, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__(SwiGLU(glu_interleave_size=glu_interleave_size), activation_recompute_in_mlp)
        self.glu_interleave_size = glu_interleave_size


class ScaledClampedQGeGLU(_ScaledActivation):
    """ClampedSwiGLU numerics with per-row post-scaling (extra input: the scales).

    Args:
        glu_interleave_size: int, optional.
        activation_recompute_in_mlp: bool, default = False. Must be False.
        limit, alpha, glu_linear_offset: As in ClampedSwiGLU.
    """

    def __init__(
        self,
        glu_interleave_size: int | None = None,
        *,
        activation_recompute_in_mlp: bool = False,
        limit: float = DEFAULT_PARAMS["limit"],
        alpha: float = DEFAULT_PARAMS["alpha"],
        glu_linear_offset: float = DEFAULT_PARAMS["glu_linear_offset"],
    ) -> None:
        act = ClampedSwiGLU(
            limit=limit, alpha=alpha, glu_linear_offset=glu_linear_offset, glu_interleave_size=glu_interleave_size
        )
        super().__init__(act, activation_recompute_in_mlp)
        self.glu_interleave_size = glu_interleave_size


class ScaledSiTUGLU(_ScaledActivation):
    """SiTU-GLU with per-row post-scaling: not yet supported (te-core has no SiTU kernel)."""

    def __init__(self, glu_interleave_size=None, *, activation_recompute_in_mlp=False, beta1=4.0, beta2=25.0):
        raise NotImplementedError(
            "te.ops.ScaledSiTUGLU is not yet supported by transformer_engine.pytorch.ops: te-core has no "
            "SiTU-GLU activation kernel yet"
        )


class ScaledTanhSReLU(_ScaledActivation):
    """Tanh-capped squared ReLU with post-scaling: not yet supported (te-core has no such kernel)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "te.ops.ScaledTanhSReLU is not yet supported by transformer_engine.pytorch.ops: te-core has no "
            "tanh-capped squared-ReLU kernel yet"
        )
