"""GEMMs on block-scaled operands (FP8 block scaling, MXFP8, NVFP4) and on the
per-tensor formats, single or grouped, on NumPy arrays (core/include/te/gemm_block.h).

    D = alpha * op(A) @ op(B) + beta * C + bias[n]     op(A) [M, K], op(B) [K, N]

Every element of op(A) and op(B) is its dequantized FP32 value. On the CPU the
block formats take the emulated path: each operand is dequantized to FP32 and
te_gemm's CPU backend multiplies them, so D equals `gemm` on the dequantized
operands bit for bit. Per-tensor FP8 and high-precision operands go straight
to te_gemm ("native").

Operands (see `operand`): a FP32/BF16/FP16 array, a `BlockOperand`, or a
quantized tensor of this package together with the copy to use (rowwise, or
columnwise with `a_columnwise` / `b_columnwise`):
    Fp8Tensor       per-tensor FP8; columnwise data is [K, M]
    Fp8BlockTensor  layout 'gemm_ready'; columnwise data is [K, M]
    Mxfp8Tensor     columnwise data keeps the input's shape (32x1 blocks)
    Nvfp4Tensor     columnwise data is [K, M]
FP8 block and NVFP4 GEMMs take the TN form (transa=False, transb=True, the
defaults: Y = X W^T); MXFP8 takes any form, the flags saying which copy an
operand is (A: transa=True means its columnwise copy; B: transb=False does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ._arrays import HIGH_PRECISION, desc, empty, fp32_scalar, matrix_shape
from ._checks import contiguous, flag, real
from ._native import lib
from .cast import Fp8Tensor
from .fp8_block import Fp8BlockTensor
from .mxfp8 import Mxfp8Tensor
from .nvfp4 import Nvfp4Tensor, _fp4_desc

SCALING = {"none": 0, "tensor": 1, "fp8_block_1d": 2, "fp8_block_2d": 3, "mxfp8": 4, "nvfp4": 5}
PATHS = ("native", "emulated")  # te_gemm_path codes 0 and 1


class BlockOperand(NamedTuple):
    """One GEMM operand as stored (te_gemm_operand)."""

    data: np.ndarray  # the stored copy; NVFP4: packed uint8 [..., K/2]
    scaling: str  # a key of SCALING
    scale_inv: np.ndarray | None = None  # tensor: FP32 scalar; block formats: their scales
    amax: np.ndarray | None = None  # NVFP4: the copy's global amax (FP32 scalar)
    swizzled_scales: bool = False  # MXFP8 / NVFP4 scales in the swizzled layout

    @property
    def shape(self) -> tuple:
        """The stored matrix's logical shape; FP4 holds two elements per byte."""
        if self.scaling == "nvfp4":
            return tuple(self.data.shape[:-1]) + (2 * self.data.shape[-1],)
        return tuple(self.data.shape)


class GemmBlockResult(NamedTuple):
    out: np.ndarray  # D, (M, N)
    path: str  # 'native' or 'emulated'


def _copy(tensor, columnwise: bool, row, col, what: str):
    chosen = col if columnwise else row
    if chosen[0] is None:
        raise ValueError(f"this {what} has no {'columnwise' if columnwise else 'rowwise'} copy")
    return chosen


def operand(x, *, columnwise: bool = False) -> BlockOperand:
    """The BlockOperand of x (see the module docstring); columnwise picks the copy."""
    if isinstance(x, BlockOperand):
        return x
    if isinstance(x, Fp8BlockTensor):
        if x.layout != "gemm_ready":
            raise ValueError("FP8 block GEMMs need the 'gemm_ready' layout, got 'compact'")
        data, scales = _copy(
            x, columnwise, (x.rowwise, x.rowwise_scale_inv), (x.columnwise, x.columnwise_scale_inv), "Fp8BlockTensor"
        )
        return BlockOperand(data, f"fp8_block_{x.block_dim}d", scales)
    if isinstance(x, Mxfp8Tensor):
        data, scales = _copy(
            x, columnwise, (x.rowwise, x.rowwise_scale_inv), (x.columnwise, x.columnwise_scale_inv), "Mxfp8Tensor"
        )
        return BlockOperand(data, "mxfp8", scales, None, x.swizzled_scales)
    if isinstance(x, Nvfp4Tensor):
        data, scales, amax = _copy(
            x,
            columnwise,
            (x.rowwise, x.rowwise_scale, x.amax_rowwise),
            (x.columnwise, x.columnwise_scale, x.amax_columnwise),
            "Nvfp4Tensor",
        )
        return BlockOperand(data, "nvfp4", scales, amax)
    if isinstance(x, Fp8Tensor):
        (data,) = _copy(x, columnwise, (x.rowwise,), (x.columnwise,), "Fp8Tensor")
        return BlockOperand(data, "tensor", x.scale_inv)
    array = np.asarray(x)
    if array.dtype not in HIGH_PRECISION:
        raise TypeError(
            "an operand must be a float32/bfloat16/float16 array, a BlockOperand or a quantized "
            f"tensor (Fp8Tensor, Fp8BlockTensor, Mxfp8Tensor, Nvfp4Tensor), got {array.dtype}"
        )
    return BlockOperand(array, "none")


class _Prepared(NamedTuple):
    params: object  # lib.GemmBlockParams
    out: np.ndarray
    keep: list  # arrays the descriptors point into


def _operand_desc(op: BlockOperand, name: str, keep: list):
    if op.scaling not in SCALING:
        raise ValueError(f"{name}.scaling must be one of {', '.join(SCALING)}, got {op.scaling!r}")
    data = contiguous(op.data, "data")
    scale = None if op.scale_inv is None else contiguous(op.scale_inv, "scale_inv")
    if op.scaling == "tensor" and scale is not None:
        scale = fp32_scalar(scale, f"{name}_scale_inv")
    amax = None if op.amax is None else fp32_scalar(op.amax, f"{name}_amax")
    keep += [data, scale, amax]
    data_desc = _fp4_desc(data) if op.scaling == "nvfp4" else desc(data)
    return lib.GemmOperandDesc(
        data_desc,
        SCALING[op.scaling],
        None if scale is None else desc(scale),
        None if amax is None else desc(amax),
        bool(op.swizzled_scales),
    )


def _prepare(
    a,
    b,
    *,
    transa=False,
    transb=True,
    a_columnwise=False,
    b_columnwise=False,
    c=None,
    alpha=1.0,
    beta=0.0,
    bias=None,
    out_dtype=np.float32,
    use_split_accumulator=True,
    force_emulation=False,
) -> _Prepared:
    transa, transb = flag(transa, "transa"), flag(transb, "transb")
    a_columnwise, b_columnwise = flag(a_columnwise, "a_columnwise"), flag(b_columnwise, "b_columnwise")
    a_op, b_op = operand(a, columnwise=a_columnwise), operand(b, columnwise=b_columnwise)
    for name, op in (("a", a_op), ("b", b_op)):
        if len(op.shape) < 2:
            raise ValueError(f"argument '{name}' must have at least 2 dims, got shape {op.shape}")
    a_rows, a_cols = matrix_shape(a_op.shape)
    b_rows, b_cols = matrix_shape(b_op.shape)
    m = a_cols if transa else a_rows
    n = b_rows if transb else b_cols
    out = empty((m, n), out_dtype)
    keep = [out]
    c_array = None if c is None else contiguous(c, "c")
    bias_array = None if bias is None else contiguous(bias, "bias")
    keep += [c_array, bias_array]
    params = lib.GemmBlockParams(
        _operand_desc(a_op, "a", keep),
        _operand_desc(b_op, "b", keep),
        desc(out),
        c=None if c_array is None else desc(c_array),
        bias=None if bias_array is None else desc(bias_array),
        alpha=real(alpha, "alpha"),
        beta=real(beta, "beta"),
        transa=transa,
        transb=transb,
        use_split_accumulator=flag(use_split_accumulator, "use_split_accumulator"),
        force_emulation=flag(force_emulation, "force_emulation"),
    )
    return _Prepared(params, out, keep)


def gemm_block(
    a,
    b,
    *,
    transa=False,
    transb=True,
    a_columnwise=False,
    b_columnwise=False,
    c=None,
    alpha=1.0,
    beta=0.0,
    bias=None,
    out_dtype=np.float32,
    use_split_accumulator=True,
    force_emulation=False,
) -> GemmBlockResult:
    """D = alpha * op(a) @ op(b) + beta * c + bias (te_gemm_block), D of out_dtype (M, N)."""
    p = _prepare(
        a,
        b,
        transa=transa,
        transb=transb,
        a_columnwise=a_columnwise,
        b_columnwise=b_columnwise,
        c=c,
        alpha=alpha,
        beta=beta,
        bias=bias,
        out_dtype=out_dtype,
        use_split_accumulator=use_split_accumulator,
        force_emulation=force_emulation,
    )
    path = lib.gemm_block(p.params)  # the CPU needs no workspace
    return GemmBlockResult(p.out, PATHS[path])


def plan_gemm_block(a, b, **kwargs) -> tuple[str, int]:
    """(path, workspace bytes) that ``gemm_block(a, b, **kwargs)`` takes (te_gemm_block_plan)."""
    p = _prepare(a, b, **kwargs)
    path, size = lib.gemm_block_plan(p.params)
    return PATHS[path], size


def _per_group(value, count: int, name: str) -> list:
    """A per-group list from a list (of count entries) or one value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"argument '{name}' must have one entry per group ({count}), got {len(value)}")
        return list(value)
    return [value] * count


def gemm_block_grouped(
    a: Sequence, b: Sequence, *, c=None, alpha=1.0, beta=0.0, bias=None, **kwargs
) -> list[GemmBlockResult]:
    """Independent GEMMs D_i = alpha_i op(a_i) op(b_i) + beta_i c_i + bias_i in one call
    (te_gemm_block_grouped). The groups share formats, types, transa/transb and
    out_dtype (keyword arguments as gemm_block, one value for all groups); c,
    bias, alpha and beta may be lists with one entry per group."""
    if len(a) != len(b):
        raise ValueError(f"arguments 'a' and 'b' must list the same number of groups, got {len(a)} and {len(b)}")
    count = len(a)
    groups = [
        _prepare(a[i], b[i], **kwargs, c=ci, alpha=al, beta=be, bias=bi)
        for i, (ci, al, be, bi) in enumerate(
            zip(
                _per_group(c, count, "c"),
                _per_group(alpha, count, "alpha"),
                _per_group(beta, count, "beta"),
                _per_group(bias, count, "bias"),
            )
        )
    ]
    paths = lib.gemm_block_grouped([g.params for g in groups])
    return [GemmBlockResult(g.out, PATHS[p]) for g, p in zip(groups, paths)]
