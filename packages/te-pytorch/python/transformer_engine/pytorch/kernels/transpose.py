"""te_transpose as a torch operator: out[K, M] = x[M, K]^T for any element type
(FP8 bytes included), on the CPU or the GPU -- the one transposition pass te-core
runs where torch's `.t().contiguous()` would run its generic strided copy."""

from __future__ import annotations

import torch

from transformer_engine.core import lib

from ._common import TORCH_TO_CODE, compiling, contiguous, desc, stream_of


def _transpose(x):
    if x.dim() != 2:
        raise ValueError(f"transpose: argument 'x' must be 2-D, got shape {tuple(x.shape)}")
    code = TORCH_TO_CODE.get(x.dtype)
    if code is None:
        raise TypeError(f"transpose: argument 'x' has unsupported dtype {x.dtype}")
    x = contiguous(x)
    out = x.new_empty((x.shape[1], x.shape[0]))
    if x.numel():
        lib.transpose(desc(x, code), desc(out, code), stream_of(x))
    return out


@torch.library.custom_op("te::transpose", mutates_args=())
def _transpose_op(x: torch.Tensor) -> torch.Tensor:
    return _transpose(x)


@_transpose_op.register_fake
def _(x):
    return x.new_empty((x.shape[1], x.shape[0]))


def transpose(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> a new contiguous [K, M] tensor (same dtype and device)."""
    return torch.ops.te.transpose(x) if compiling() else _transpose(x)
