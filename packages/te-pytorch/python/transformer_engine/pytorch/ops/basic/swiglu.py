r"""SwiGLU-family gated activations: SwiGLU, ClampedSwiGLU (GPT-OSS) and SiTUGLU.

glu_interleave_size=s: the input's last dim holds blocks of s gate values
and s linear values in turn, :math:`[a_1..a_s, b_1..b_s, a_{s+1}..]`, instead
of the two halves :math:`[a | b]`. The op reorders it to halves for the
kernel and reorders the input gradient back (a copy, no arithmetic).
"""

from __future__ import annotations

import torch

from transformer_engine.core.activation import DEFAULT_PARAMS

from .activation import _ActivationOperation

__all__ = ["ClampedSwiGLU", "SiTUGLU", "SwiGLU"]


def _halves_from_blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    """[.., (a-block, b-block) * n] -> [.., a-blocks | b-blocks]."""
    shape = x.shape
    if shape[-1] % (2 * size):
        raise ValueError(f"glu_interleave_size={size} needs the last dim divisible by {2 * size}, got {tuple(shape)}")
    return x.reshape(-1, shape[-1] // (2 * size), 2, size).transpose(1, 2).contiguous().view(shape)


def _blocks_from_halves(x: torch.Tensor, size: int) -> torch.Tensor:
    """The inverse of _halves_from_blocks."""
    shape = x.shape
    return x.reshape(-1, 2, shape[-1] // (2 * size), size).transpose(1, 2).contiguous().view(shape)


class SwiGLU(_ActivationOperation):
    r"""SiLU-gated linear unit: :math:`\text{SiLU}(a) * b`, a and b the halves
    of the last dim (the first half gated).

    Args:
        cache_quantized_input: bool, default = False. Keep the input for backward quantized to FP8 (E4M3, current
            scaling).
        glu_interleave_size: int, optional. Block-interleaved layout of the gate and linear values (module
            docstring).
    """

    _kind = "swiglu"

    def __init__(self, *, cache_quantized_input: bool = False, glu_interleave_size: int | None = None) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input)
        if glu_interleave_size is not None and (isinstance(glu_interleave_size, bool) or glu_interleave_size <= 0):
            raise ValueError(f"glu_interleave_size must be a positive int or None, got {glu_interleave_size!r}")
        self.glu_interleave_size = glu_interleave_size

    def _to_kernel_layout(self, x):
        return x if self.glu_interleave_size is None else _halves_from_blocks(x, self.glu_interleave_size)

    def _from_kernel_layout(self, dx):
        return dx if self.glu_interleave_size is None else _blocks_from_halves(dx, self.glu_interleave_size)


class ClampedSwiGLU(SwiGLU):
    r"""GPT-OSS's clamped SwiGLU: :math:`c \sigma(\alpha c) (\text{clamp}(b, -l, l) + o)`
    with :math:`c = \min(a, l)`, l = limit, o = glu_linear_offset.

    Args:
        limit: float, default = 7.0.
        alpha: float, default = 1.702.
        glu_linear_offset: float, default = 1.0.
        cache_quantized_input, glu_interleave_size: As in SwiGLU.
    """

    _kind = "clamped_swiglu"

    def __init__(
        self,
        *,
        limit: float = DEFAULT_PARAMS["limit"],
        alpha: float = DEFAULT_PARAMS["alpha"],
        glu_linear_offset: float = DEFAULT_PARAMS["glu_linear_offset"],
        cache_quantized_input: bool = False,
        glu_interleave_size: int | None = None,
    ) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input, glu_interleave_size=glu_interleave_size)
        self.limit = float(limit)
        self.alpha = float(alpha)
        self.glu_linear_offset = float(glu_linear_offset)

    def _params(self) -> dict:
        return {"limit": self.limit, "alpha": self.alpha, "glu_linear_offset": self.glu_linear_offset}


class SiTUGLU(SwiGLU):
    """Soft-capped SiLU GLU (Kimi K3): not yet supported (te-core has no SiTU kernel)."""

    def __init__(
        self,
        *,
        beta1: float = 4.0,
        beta2: float = 25.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: int | None = None,
    ) -> None:
        raise NotImplementedError(
            "te.ops.SiTUGLU is not yet supported by transformer_engine.pytorch.ops: te-core has no SiTU-GLU "
            "activation kernel yet"
        )
