"""Per-tensor FP8 cast ops: torch.ops.te.quantize_fp8, quantize_fp8_current_scaling,
dequantize_fp8, compute_amax, compute_scale_from_amax.

Numerics are te-core's (core/include/te/cast.h):
    q = saturate(RNE(float32(x) * scale)),  scale_inv = 1 / scale,  x' = float32(q) * scale_inv
A tensor is viewed as a matrix [M, K] (K = last dim); the "columnwise" copy is
its transpose [K, M], written in the same pass (what Hopper FP8 GEMMs need for
the wgrad/dgrad operands). FP8 bytes are torch.uint8 tensors; `fp8_dtype` is
the core's code (DType.kFloat8E4M3 = 7, DType.kFloat8E5M2 = 8).

Each op is one implementation (it allocates the outputs with torch and calls
te-core on the tensors' device and current stream) and a shape rule, made an
op by _common.te_op. The quantizers use `quantize_fp8_prepared` /
`quantize_fp8_current_scaling_prepared` instead: the same core calls with the
descriptors of their persistent scale/amax made once. An output that was not
requested is None.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import lib

from ._common import (
    BYTE,
    FLOAT32,
    FP8_CODES,
    TORCH_TO_CODE,
    code_of,
    contiguous,
    desc,
    hp_desc,
    matrix_t_shape,
    run_dequantizer,
    scalar_desc,
    stream_of,
    te_op,
)


def _check_fp8(fp8_dtype: int) -> None:
    if fp8_dtype not in FP8_CODES:
        raise TypeError(f"fp8_dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2, got {fp8_dtype!r}")


def _fp8_outputs(x: torch.Tensor, rowwise: bool, columnwise: bool):
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    row = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if rowwise else None
    col = torch.empty(matrix_t_shape(x.shape), dtype=torch.uint8, device=x.device) if columnwise else None
    return row, col


def fp8_shapes(shape, rowwise: bool, columnwise: bool):
    """Shape-rule entries of FP8 rowwise bytes of `shape` and their [K, M] columnwise copy."""
    return (
        (shape, torch.uint8) if rowwise else None,
        (matrix_t_shape(shape), torch.uint8) if columnwise else None,
    )


# --------------------------------------------------------------------------- delayed scaling


_FP8 = tuple[Tensor | None, Tensor | None, Tensor]


@te_op(
    "quantize_fp8",
    mutates_args=("amax",),
    shapes=lambda a: (*fp8_shapes(a.x.shape, a.rowwise, a.columnwise), ((1,), torch.float32)),
)
def quantize_fp8(
    x: Tensor, scale: Tensor, amax: Tensor | None, fp8_dtype: int, rowwise: bool = True, columnwise: bool = False
) -> _FP8:
    """Delayed-scaling quantize with a given FP32 one-element `scale`.

    `amax` (FP32, one element, or None) is max-accumulated in place with
    max|x|. Returns (rowwise uint8 | None, columnwise uint8 [K, M] | None,
    scale_inv FP32 [1]).
    """
    _check_fp8(fp8_dtype)
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    amax_desc = None if amax is None else desc(amax, FLOAT32)
    return quantize_fp8_prepared(x, desc(scale, FLOAT32), amax_desc, fp8_dtype, rowwise, columnwise)


def _prepared_outputs(x, fp8_dtype: int, rowwise: bool, columnwise: bool):
    """x contiguous, its outputs (rowwise, columnwise, a fresh FP32 [1] scale_inv)
    and all their descriptors, plus the stream: the per-call part of the fast
    paths. The caller must hold the returned x until the core call is made: a
    descriptor is a raw pointer and does not keep a contiguous copy alive."""
    if not x.is_contiguous():
        x = x.contiguous()
    code = TORCH_TO_CODE.get(x.dtype)
    if code is None or code == BYTE:
        code_of(x, "x")  # (raises, naming the argument)
    shape, device = x.shape, x.device
    index = x.get_device()
    if index >= 0:
        dev, stream = 1, torch._C._cuda_getCurrentRawStream(index)
    else:
        dev = index = stream = 0
    make = lib.TensorDesc
    row = col = row_desc = col_desc = None
    # (empty_like, and sizes as separate int arguments: torch parses a
    # torch.Size argument about twice as slowly as a tuple of ints, and a
    # tuple about 1.5x as slowly as the ints passed one by one.)
    if rowwise:
        row = torch.empty_like(x, dtype=torch.uint8)
        row_desc = make(row.data_ptr(), fp8_dtype, shape, dev, index)
    if columnwise:
        col_shape = matrix_t_shape(shape)
        col = torch.empty(*col_shape, dtype=torch.uint8, device=device)
        col_desc = make(col.data_ptr(), fp8_dtype, col_shape, dev, index)
    # Its own allocation (not a slice of a shared one): the GEMMs need 16-byte
    # aligned scale pointers and would copy a misaligned one first (a launch).
    scale_inv = torch.empty(1, dtype=torch.float32, device=device)
    sinv_desc = make(scale_inv.data_ptr(), FLOAT32, (1,), dev, index)
    descs = (make(x.data_ptr(), code, shape, dev, index), row_desc, col_desc, sinv_desc)
    return x, (row, col, scale_inv), descs, stream


def quantize_fp8_prepared(x, scale_desc, amax_desc, fp8_dtype: int, rowwise: bool, columnwise: bool):
    """The eager fast path of quantize_fp8 for callers that checked fp8_dtype
    and rowwise/columnwise once and keep the descriptors of their persistent
    scale and amax (the quantizers): per call it only allocates the outputs
    and describes x and them. Returns (rowwise | None, columnwise | None, scale_inv)."""
    x, outs, (x_desc, row_desc, col_desc, sinv_desc), stream = _prepared_outputs(x, fp8_dtype, rowwise, columnwise)
    lib.quantize_fp8(x_desc, scale_desc, row_desc, col_desc, sinv_desc, amax_desc, stream)
    return outs


def quantize_fp8_current_scaling_prepared(
    x, scale_desc, amax_desc, fp8_dtype: int, rowwise: bool, columnwise: bool, force_pow_2_scales, amax_epsilon
):
    """The eager fast path of quantize_fp8_current_scaling: the computed scale
    and amax go to the caller's persistent FP32 [1] tensors (scale_desc,
    amax_desc), the scale_inv to a fresh aligned one.
    Returns (rowwise | None, columnwise | None, scale_inv)."""
    x, outs, (x_desc, row_desc, col_desc, sinv_desc), stream = _prepared_outputs(x, fp8_dtype, rowwise, columnwise)
    lib.quantize_fp8_current_scaling(
        x_desc, row_desc, col_desc, scale_desc, sinv_desc, amax_desc, force_pow_2_scales, amax_epsilon, stream
    )
    return outs


# --------------------------------------------------------------------------- current scaling


@te_op(
    "quantize_fp8_current_scaling",
    shapes=lambda a: (*fp8_shapes(a.x.shape, a.rowwise, a.columnwise), ((3,), torch.float32)),
)
def quantize_fp8_current_scaling(
    x: Tensor,
    fp8_dtype: int,
    rowwise: bool = True,
    columnwise: bool = False,
    force_pow_2_scales: bool = False,
    amax_epsilon: float = 0.0,
) -> _FP8:
    """amax(x) -> scale -> quantize, in one core call.

    Returns (rowwise | None, columnwise | None, stats) with stats an FP32 [3]
    tensor (scale, scale_inv, amax); stats[1:2] is the scale_inv to keep.
    """
    _check_fp8(fp8_dtype)
    x = contiguous(x)
    row, col = _fp8_outputs(x, rowwise, columnwise)
    # scale, scale_inv and amax share one allocation: [scale, scale_inv, amax].
    stats = torch.empty((3,), dtype=torch.float32, device=x.device)
    lib.quantize_fp8_current_scaling(
        hp_desc(x, "x"),
        None if row is None else desc(row, fp8_dtype),
        None if col is None else desc(col, fp8_dtype),
        scalar_desc(stats, 0),
        scalar_desc(stats, 1),
        scalar_desc(stats, 2),
        force_pow_2_scales,
        amax_epsilon,
        stream_of(x),
    )
    return row, col, stats


# --------------------------------------------------------------------------- amax and scale


@te_op("compute_amax", shapes=lambda a: ((1,), torch.float32))
def compute_amax(x: Tensor) -> Tensor:
    """max |x| over the non-NaN elements, as an FP32 [1] tensor on x's device."""
    x = contiguous(x)
    amax = torch.empty((1,), dtype=torch.float32, device=x.device)
    lib.compute_amax(hp_desc(x, "x"), desc(amax, FLOAT32), stream_of(x))
    return amax


@te_op("compute_scale_from_amax", shapes=lambda a: ((2,), torch.float32))
def compute_scale_from_amax(
    amax: Tensor, fp8_dtype: int, force_pow_2_scales: bool = False, amax_epsilon: float = 0.0
) -> Tensor:
    """FP32 [2] tensor (scale, scale_inv) from a one-element FP32 amax (cast.h rules)."""
    _check_fp8(fp8_dtype)
    out = torch.empty((2,), dtype=torch.float32, device=amax.device)
    lib.compute_scale_from_amax(
        desc(amax, FLOAT32),
        scalar_desc(out, 0),
        scalar_desc(out, 1),
        fp8_dtype,
        force_pow_2_scales,
        amax_epsilon,
        stream_of(amax),
    )
    return out


# --------------------------------------------------------------------------- dequantize


@te_op("dequantize_fp8", shapes=lambda a: (a.data.shape, a.out_dtype))
def dequantize_fp8(data: Tensor, scale_inv: Tensor, fp8_dtype: int, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """float32(q) * scale_inv rounded to out_dtype (float32, bfloat16 or float16)."""
    _check_fp8(fp8_dtype)
    if data.dtype != torch.uint8:
        raise TypeError(f"argument 'data' must hold FP8 bytes as torch.uint8, got {data.dtype}")
    return run_dequantizer(lib.dequantize_fp8, data, fp8_dtype, scale_inv, FLOAT32, out_dtype)
