"""te_transpose as a torch operator: out[K, M] = x[M, K]^T for any element type
(FP8 bytes included), on the CPU or the GPU -- the one transposition pass te-core
runs where torch's `.t().contiguous()` would run its generic strided copy."""

from __future__ import annotations

from torch import Tensor

from transformer_engine.core import lib

from ._common import TORCH_TO_CODE, contiguous, desc, stream_of, te_op


@te_op("transpose", shapes=lambda a: ((a.x.shape[1], a.x.shape[0]), a.x.dtype))
def transpose(x: Tensor) -> Tensor:
    """x [M, K] -> a new contiguous [K, M] tensor (same dtype and device)."""
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
