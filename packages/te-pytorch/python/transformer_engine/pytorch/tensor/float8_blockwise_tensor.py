"""FP8 block scaling: Float8BlockwiseQTensor and Float8BlockQuantizer
(recipe Float8BlockScaling, DeepSeek-v3 style).

A Float8BlockwiseQTensor of nominal shape S (viewed as [M, K]) holds, in the
GEMM-ready layout (data_format "gemm_ready"):
    _rowwise_data          uint8 FP8 bytes of shape S, or None
    _rowwise_scale_inv     FP32 per 1x128 block (is_2D_scaled: per 128x128 tile)
    _columnwise_data       uint8 FP8 bytes [K, M] (the transpose), or None
    _columnwise_scale_inv  FP32 per 128x1 block (2-D: per tile)
    _fp8_dtype, _is_2D_scaled, _data_format
value = float32(q) * scale_inv[block];  scale_inv = 1 / s,
s = fp8_max / max(block_amax, amax_epsilon) (a power of 2 with force_pow_2_scales).
"""

from __future__ import annotations

from typing import ClassVar

from .. import kernels
from ..kernels.gemm_block import SCALING
from ._block_tensor import BlockQuantizedTensor, BlockQuantizer
from .float8_tensor import fp8_dtype_of


class Float8BlockwiseQTensor(BlockQuantizedTensor):
    """FP8 block-scaled tensor (see the module docstring)."""

    BUFFERS: ClassVar[tuple] = ("rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv")
    META: ClassVar[tuple] = ("fp8_dtype", "is_2D_scaled", "data_format")

    def _dequantize(self, dtype):
        code, dim = int(self._fp8_dtype), 2 if self._is_2D_scaled else 1
        if self._rowwise_data is not None:
            return kernels.dequantize_fp8_block(self._rowwise_data, self._rowwise_scale_inv, code, dim, False, dtype)
        cols = kernels.dequantize_fp8_block(self._columnwise_data, self._columnwise_scale_inv, code, dim, True, dtype)
        return cols.t().reshape(self.shape)

    @staticmethod
    def gemm_args(fields: dict, columnwise: bool) -> tuple:
        """The operand tuple of kernels.gemm_block for one copy."""
        prefix = "columnwise" if columnwise else "rowwise"
        scaling = SCALING["fp8_block_2d" if fields["is_2D_scaled"] else "fp8_block_1d"]
        return (fields[f"{prefix}_data"], scaling, int(fields["fp8_dtype"]), fields[f"{prefix}_scale_inv"], None, False)


class Float8BlockQuantizer(BlockQuantizer):
    """FP8 block quantizer: block_scaling_dim 1 (1x128 / 128x1) or 2 (128x128)."""

    TENSOR = Float8BlockwiseQTensor
    KIND = "fp8_block"

    def __init__(
        self,
        fp8_dtype,
        *,
        rowwise: bool,
        columnwise: bool,
        amax_epsilon: float = 0.0,
        force_pow_2_scales: bool = True,
        block_scaling_dim: int = 2,
    ):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if block_scaling_dim not in (1, 2) or isinstance(block_scaling_dim, bool):
            raise ValueError(f"block_scaling_dim must be 1 or 2, got {block_scaling_dim!r}")
        self.dtype = fp8_dtype_of(fp8_dtype)
        self.amax_epsilon = float(amax_epsilon)
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.block_scaling_dim = int(block_scaling_dim)

    def quantize_fields(self, x, rowwise, columnwise):
        row, row_s, col, col_s = kernels.quantize_fp8_block(
            x, int(self.dtype), self.block_scaling_dim, rowwise, columnwise, self.force_pow_2_scales, self.amax_epsilon
        )
        return {
            "rowwise_data": row,
            "rowwise_scale_inv": row_s,
            "columnwise_data": col,
            "columnwise_scale_inv": col_s,
            "fp8_dtype": self.dtype,
            "is_2D_scaled": self.block_scaling_dim == 2,
            "data_format": "gemm_ready",
        }

    def __reduce__(self):
        return (
            _make_block_quantizer,
            (
                int(self.dtype),
                self.rowwise_usage,
                self.columnwise_usage,
                self.amax_epsilon,
                self.force_pow_2_scales,
                self.block_scaling_dim,
            ),
        )


def _make_block_quantizer(fp8_dtype, rowwise, columnwise, amax_epsilon, force_pow_2_scales, block_scaling_dim):
    return Float8BlockQuantizer(
        fp8_dtype,
        rowwise=rowwise,
        columnwise=columnwise,
        amax_epsilon=amax_epsilon,
        force_pow_2_scales=force_pow_2_scales,
        block_scaling_dim=block_scaling_dim,
    )


SAFE_GLOBALS = [Float8BlockwiseQTensor, Float8BlockQuantizer, _make_block_quantizer]
