"""NVFP4: NVFP4Tensor and NVFP4Quantizer (recipe NVFP4BlockScaling).

An NVFP4Tensor of nominal shape S (viewed as [M, K]) holds
    _rowwise_data          uint8 [..., K/2]: two E2M1 codes per byte, or None
    _rowwise_scale_inv     uint8 E4M3 [roundup(M,128), roundup(K/16,4)]
    _columnwise_data       uint8 [K, M/2]: the transpose, or None
    _columnwise_scale_inv  uint8 E4M3 [roundup(K,128), roundup(M/16,4)]
    _amax_rowwise, _amax_columnwise   FP32 [1]: the global amaxes each copy used
    _fp4_dtype             DType.kFloat4E2M1
    _rht_sign_mask         None, or the RHT sign mask the columnwise copy carries
value = q * s_b / S_enc, S_enc = 2688 / amax (kernels/nvfp4.py). With the
random Hadamard transform (RHT) the columnwise copy holds x H, H = (1/4)
diag(S) H16 on 16-element blocks along M; dequantizing it applies H^T.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from transformer_engine.core import DType
from transformer_engine.core.nvfp4 import RHT_SIGN_MASK

from .. import kernels
from ..kernels.gemm_block import SCALING
from ._block_tensor import BlockQuantizedTensor, BlockQuantizer


def _undo_rht(values: torch.Tensor, mask: int) -> torch.Tensor:
    """values (rows of 16-element blocks) @ H^T, H^T = (1/4) H16 diag(S), in FP32."""
    idx = torch.arange(16)
    both = torch.bitwise_and(idx[:, None], idx[None, :])
    parity = sum((both >> bit) & 1 for bit in range(4)) % 2
    h16 = 1.0 - 2.0 * parity  # Sylvester: H16[i][j] = (-1)^popcount(i & j)
    signs = 1.0 - 2.0 * ((mask >> idx) & 1)
    h_t = (h16 * signs[None, :] / 4).to(device=values.device, dtype=torch.float32)
    rows, cols = values.shape
    return (values.float().reshape(rows, cols // 16, 16) @ h_t).reshape(rows, cols)


class NVFP4Tensor(BlockQuantizedTensor):
    """NVFP4 tensor (see the module docstring)."""

    BUFFERS: ClassVar[tuple] = (
        "rowwise_data",
        "rowwise_scale_inv",
        "columnwise_data",
        "columnwise_scale_inv",
        "amax_rowwise",
        "amax_columnwise",
    )
    META: ClassVar[tuple] = ("fp4_dtype", "rht_sign_mask")

    def _dequantize(self, dtype):
        if self._rowwise_data is not None:
            return kernels.dequantize_nvfp4(self._rowwise_data, self._rowwise_scale_inv, self._amax_rowwise, dtype)
        mask = self._rht_sign_mask
        out_dtype = torch.float32 if mask is not None else dtype
        cols = kernels.dequantize_nvfp4(
            self._columnwise_data, self._columnwise_scale_inv, self._amax_columnwise, out_dtype
        )
        if mask is not None:
            cols = _undo_rht(cols, mask).to(dtype)
        return cols.t().reshape(self.shape)

    @staticmethod
    def gemm_args(fields: dict, columnwise: bool) -> tuple:
        """The operand tuple of kernels.gemm_block for one copy."""
        prefix = "columnwise" if columnwise else "rowwise"
        return (
            fields[f"{prefix}_data"],
            SCALING["nvfp4"],
            -1,
            fields[f"{prefix}_scale_inv"],
            fields[f"amax_{prefix}"],
            False,
        )


class NVFP4Quantizer(BlockQuantizer):
    """NVFP4 quantizer with the reference's constructor arguments.

    with_rht: random Hadamard transform on the columnwise copy (sign mask
    RHT_SIGN_MASK with with_random_sign_mask, else all +1); with_post_rht_amax:
    the columnwise global amax is that of the transformed values (else of x);
    with_2d_quantization: 16x16 tiles (weights); stochastic_rounding: Philox
    stochastic rounding seeded from torch's generator of x's device.
    Not implemented (NotImplementedError): with_amax_reduction,
    row_scaled_nvfp4, nvfp4_use_4over6 and an nvfp4_e4m3_max other than 448.
    """

    TENSOR = NVFP4Tensor
    KIND = "nvfp4"

    def __init__(
        self,
        fp4_dtype=DType.kFloat4E2M1,
        rowwise: bool = True,
        columnwise: bool = True,
        with_amax_reduction: bool = False,
        amax_reduction_group=None,
        with_rht: bool = False,
        with_post_rht_amax: bool = False,
        with_2d_quantization: bool = False,
        stochastic_rounding: bool = False,
        row_scaled_nvfp4: bool = False,
        nvfp4_use_4over6: bool = False,
        nvfp4_e4m3_max: int = 448,
        nvfp4_4over6_err_mode: str = "MAE",
        with_random_sign_mask: bool = True,
    ):
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        if int(fp4_dtype) != int(DType.kFloat4E2M1):
            raise TypeError(f"fp4_dtype must be DType.kFloat4E2M1, got {fp4_dtype!r}")
        unsupported = {
            "with_amax_reduction": (with_amax_reduction, False),
            "row_scaled_nvfp4": (row_scaled_nvfp4, False),
            "nvfp4_use_4over6": (nvfp4_use_4over6, False),
            "nvfp4_e4m3_max": (nvfp4_e4m3_max, 448),
        }
        for name, (value, default) in unsupported.items():
            if value != default:
                raise NotImplementedError(
                    f"NVFP4Quantizer: {name}={value!r} is not yet supported by transformer_engine.pytorch; "
                    f"leave it at {default!r}"
                )
        self.dtype = DType.kFloat4E2M1
        self.amax_reduction_group = amax_reduction_group
        self.with_rht = bool(with_rht)
        self.with_post_rht_amax = bool(with_post_rht_amax)
        self.with_2d_quantization = bool(with_2d_quantization)
        self.stochastic_rounding = bool(stochastic_rounding)
        self.nvfp4_4over6_err_mode = nvfp4_4over6_err_mode
        self.with_random_sign_mask = bool(with_random_sign_mask)
        self.rht_sign_mask = RHT_SIGN_MASK if with_random_sign_mask else 0

    def quantize_fields(self, x, rowwise, columnwise, rng_state=None):
        rht = self.with_rht and columnwise and not self.with_2d_quantization
        if self.stochastic_rounding and rng_state is None:
            rng_state = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=x.device)
        amax = None
        if rht and not self.with_post_rht_amax:
            # The columnwise copy is scaled with the pre-transform amax of x.
            pre = x.detach().abs().amax().float().reshape(1)
            amax = torch.cat([pre, pre])
        row, row_s, col, col_s, amaxes = kernels.quantize_nvfp4(
            x,
            rowwise,
            columnwise,
            self.with_2d_quantization,
            self.stochastic_rounding,
            rht,
            self.rht_sign_mask,
            rng_state,
            amax,
        )
        return {
            "rowwise_data": row,
            "rowwise_scale_inv": row_s,
            "columnwise_data": col,
            "columnwise_scale_inv": col_s,
            "amax_rowwise": amaxes[0:1],
            "amax_columnwise": amaxes[1:2],
            "fp4_dtype": self.dtype,
            "rht_sign_mask": self.rht_sign_mask if rht else None,
        }

    def __reduce__(self):
        return (
            _make_nvfp4_quantizer,
            (
                self.rowwise_usage,
                self.columnwise_usage,
                self.with_rht,
                self.with_post_rht_amax,
                self.with_2d_quantization,
                self.stochastic_rounding,
                self.with_random_sign_mask,
            ),
        )


def _make_nvfp4_quantizer(rowwise, columnwise, with_rht, post_rht_amax, with_2d, stochastic, random_sign_mask):
    return NVFP4Quantizer(
        rowwise=rowwise,
        columnwise=columnwise,
        with_rht=with_rht,
        with_post_rht_amax=post_rht_amax,
        with_2d_quantization=with_2d,
        stochastic_rounding=stochastic,
        with_random_sign_mask=random_sign_mask,
    )


SAFE_GLOBALS = [NVFP4Tensor, NVFP4Quantizer, _make_nvfp4_quantizer]
