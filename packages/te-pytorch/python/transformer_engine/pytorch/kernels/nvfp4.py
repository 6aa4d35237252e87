"""NVFP4 ops: torch.ops.te.quantize_nvfp4 and torch.ops.te.dequantize_nvfp4.

Numerics are te-core's (core/include/te/nvfp4.h); for x viewed as [M, K]:
    S_enc = min(2688 / amax, FLT_MAX) (1 when amax is 0 or inf),  S_dec = 1 / S_enc
    s_b   = e4m3(block_amax * (S_enc * (1/6)))    one E4M3 scale per 16 elements
    q     = e2m1(x * min(1 / (s_b * S_dec), FLT_MAX)),   x' = q * s_b * S_dec
Packed data is uint8, two E2M1 codes per byte (element 2i in the low nibble):
rowwise [..., K/2], columnwise the [K, M] transpose as [K, M/2]. Scales are
uint8 E4M3 bytes [roundup(rows,128), roundup(cols/16,4)] of the stored matrix.
block_2d uses 16x16 tiles (weights); random_hadamard transforms the
columnwise copy (and its amax); stochastic_rounding draws Philox words from
rng_state, an int64 [2] tensor (seed, offset) on x's device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import DType, lib
from transformer_engine.core.nvfp4 import scale_shape

from ._common import contiguous, desc, empty_outputs, hp_desc, matrix_t_shape, scalar_desc, stream_of, te_op

FP4, E4M3, INT64 = int(DType.kFloat4E2M1), int(DType.kFloat8E4M3), int(DType.kInt64)


def fp4_desc(packed: torch.Tensor):
    """Descriptor of packed bytes [..., n] as the FP4 tensor [..., 2n]."""
    return _fp4(packed, (*packed.shape[:-1], 2 * packed.shape[-1]))


def _fp4(packed, shape):
    if packed.is_cuda:
        return lib.TensorDesc(packed.data_ptr(), FP4, shape, 1, packed.device.index)
    return lib.TensorDesc(packed.data_ptr(), FP4, shape, 0, 0)


def _outputs(shape, rowwise, columnwise):
    """(shape, dtype) of (row, row_scale, col, col_scale, amaxes FP32 [2]); None = not requested."""
    cols, rows = matrix_t_shape(shape)
    row = (((*shape[:-1], cols // 2), torch.uint8), (scale_shape(rows, cols), torch.uint8))
    col = (((cols, rows // 2), torch.uint8), (scale_shape(cols, rows), torch.uint8))
    return (*(row if rowwise else (None, None)), *(col if columnwise else (None, None)), ((2,), torch.float32))


def _check_mask(mask: int) -> None:
    if not 0 <= mask <= 0xFFFF:
        raise ValueError(f"rht_sign_mask must be a 16-bit mask (0..0xFFFF), got {mask:#x}")


@te_op("quantize_nvfp4", shapes=lambda a: _outputs(a.x.shape, a.rowwise, a.columnwise))
def quantize_nvfp4(
    x: Tensor,
    rowwise: bool = True,
    columnwise: bool = False,
    block_2d: bool = False,
    stochastic_rounding: bool = False,
    random_hadamard: bool = False,
    rht_sign_mask: int = 0,
    rng_state: Tensor | None = None,
    amax: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None, Tensor]:
    """NVFP4-quantize x. amax: FP32 [2] (rowwise, columnwise global amax), or None
    to use x's own (post-RHT for columnwise with random_hadamard).

    Returns (row | None, row_scale | None, col | None, col_scale | None, amaxes FP32 [2]).
    """
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    rht_sign_mask = int(rht_sign_mask)
    _check_mask(rht_sign_mask)
    if stochastic_rounding and (rng_state is None or rng_state.dtype != torch.int64 or rng_state.numel() != 2):
        raise ValueError("stochastic_rounding needs 'rng_state': an int64 tensor of 2 elements (seed, offset)")
    x = contiguous(x)
    row, row_s, col, col_s, amaxes = empty_outputs(_outputs(x.shape, rowwise, columnwise), x)
    stream = stream_of(x)
    rht = random_hadamard and columnwise
    if amax is None:
        lib.nvfp4_compute_amax(
            hp_desc(x, "x"), scalar_desc(amaxes, 0), scalar_desc(amaxes, 1), rht, rht_sign_mask, stream
        )
    else:
        if amax.dtype != torch.float32 or amax.numel() != 2:
            raise ValueError("argument 'amax' must be an FP32 tensor of 2 elements (rowwise, columnwise amax)")
        amaxes.copy_(amax.reshape(2))
    lib.nvfp4_quantize(
        hp_desc(x, "x"),
        scalar_desc(amaxes, 0) if rowwise else None,
        None if row is None else _fp4(row, x.shape),
        None if row_s is None else desc(row_s, E4M3),
        scalar_desc(amaxes, 1) if columnwise else None,
        None if col is None else _fp4(col, (col.shape[0], 2 * col.shape[1])),
        None if col_s is None else desc(col_s, E4M3),
        block_2d,
        stochastic_rounding,
        rht,
        rht_sign_mask,
        desc(contiguous(rng_state), INT64) if stochastic_rounding else None,
        stream,
    )
    return row, row_s, col, col_s, amaxes


@te_op("dequantize_nvfp4", shapes=lambda a: ((*a.data.shape[:-1], 2 * a.data.shape[-1]), a.out_dtype))
def dequantize_nvfp4(data: Tensor, scale: Tensor, amax: Tensor, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """Packed data [..., B/2] with its E4M3 scales and FP32 global amax (one element) -> [..., B]."""
    if data.dtype != torch.uint8 or scale.dtype != torch.uint8:
        raise TypeError("arguments 'data' and 'scale' must be uint8 (packed E2M1 codes and E4M3 bytes)")
    data, scale = contiguous(data), contiguous(scale)
    out = torch.empty((*data.shape[:-1], 2 * data.shape[-1]), dtype=out_dtype, device=data.device)
    lib.nvfp4_dequantize(
        _fp4(data, out.shape),
        desc(scale, E4M3),
        scalar_desc(contiguous(amax.reshape(-1).to(torch.float32)), 0),
        hp_desc(out, "out_dtype"),
        stream_of(data),
    )
    return out
