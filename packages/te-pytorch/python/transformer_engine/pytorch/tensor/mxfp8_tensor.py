"""MXFP8: MXFP8Tensor and MXFP8Quantizer (recipe MXFP8BlockScaling).

An MXFP8Tensor of nominal shape S (viewed as [M, K], K = last dim) holds
    _rowwise_data          uint8 FP8 bytes of shape S, 1x32 blocks, or None
    _rowwise_scale_inv     uint8 E8M0 [roundup(M,128), roundup(K/32,4)]
    _columnwise_data       uint8 FP8 bytes of shape S (not transposed), 32x1 blocks, or None
    _columnwise_scale_inv  uint8 E8M0 [roundup(M/32,4), roundup(K,128)]
    _fp8_dtype             DType.kFloat8E4M3 or DType.kFloat8E5M2
value = q * 2^(e - 127) with e the block's E8M0 byte (kernels/mxfp8.py).
The two copies are quantized separately from the high-precision tensor.
"""

from __future__ import annotations

from typing import ClassVar

from .. import kernels
from ..kernels.gemm_block import SCALING
from ._block_tensor import BlockQuantizedTensor, BlockQuantizer
from .float8_tensor import fp8_dtype_of


class MXFP8Tensor(BlockQuantizedTensor):
    """MXFP8 tensor (see the module docstring)."""

    BUFFERS: ClassVar[tuple] = ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")
    META: ClassVar[tuple] = ("fp8_dtype",)

    def _dequantize(self, dtype):
        code = int(self._fp8_dtype)
        if self._rowwise_data is not None:
            return kernels.dequantize_mxfp8(self._rowwise_data, self._rowwise_scale_inv, code, False, False, dtype)
        return kernels.dequantize_mxfp8(self._columnwise_data, self._columnwise_scale_inv, code, True, False, dtype)

    @staticmethod
    def gemm_args(fields: dict, columnwise: bool) -> tuple:
        """The operand tuple of kernels.gemm_block for one copy."""
        prefix = "columnwise" if columnwise else "rowwise"
        data = fields[f"{prefix}_data"]
        return (data, SCALING["mxfp8"], int(fields["fp8_dtype"]), fields[f"{prefix}_scale_inv"], None, False)


class MXFP8Quantizer(BlockQuantizer):
    """MXFP8 quantizer: 1x32 (rowwise) and 32x1 (columnwise) E8M0-scaled blocks;
    with_2d_quantization uses one 32x32 tile for both (weights, optional)."""

    TENSOR = MXFP8Tensor
    KIND = "mxfp8"

    def __init__(self, fp8_dtype, *, rowwise: bool = True, columnwise: bool = True, with_2d_quantization=False):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = fp8_dtype_of(fp8_dtype)
        self.with_2d_quantization = bool(with_2d_quantization)

    def quantize_fields(self, x, rowwise, columnwise):
        row, row_s, col, col_s = kernels.quantize_mxfp8(
            x, int(self.dtype), rowwise, columnwise, self.with_2d_quantization, False
        )
        return {
            "rowwise_data": row,
            "rowwise_scale_inv": row_s,
            "columnwise_data": col,
            "columnwise_scale_inv": col_s,
            "fp8_dtype": self.dtype,
        }

    def __reduce__(self):
        return (
            _make_mxfp8_quantizer,
            (int(self.dtype), self.rowwise_usage, self.columnwise_usage, self.with_2d_quantization),
        )


def _make_mxfp8_quantizer(fp8_dtype, rowwise, columnwise, with_2d):
    return MXFP8Quantizer(fp8_dtype, rowwise=rowwise, columnwise=columnwise, with_2d_quantization=with_2d)


SAFE_GLOBALS = [MXFP8Tensor, MXFP8Quantizer, _make_mxfp8_quantizer]
