"""Operands for the block-scaled GEMM tests (CPU and GPU): a Linear layer's
three GEMMs in every block format, quantized by the core's CPU quantizers,
with each stored copy's FP32 dequantized values from the format's own
dequantize function (what te_gemm_block is defined to multiply).

Linear layer: Y = X W^T with X [T, In], W [Out, In], dY [T, Out]:
    fprop  op(A) = X       [T, In]    op(B) = W^T  [In, Out]
    dgrad  op(A) = dY      [T, Out]   op(B) = W    [Out, In]
    wgrad  op(A) = dY^T    [Out, T]   op(B) = X    [T, In]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import transformer_engine.core as tec
from transformer_engine.core import BlockOperand

FORMATS = ("fp8_block", "mxfp8", "nvfp4")


class Case(NamedTuple):
    a: BlockOperand
    b: BlockOperand
    transa: bool
    transb: bool
    a_deq: np.ndarray  # FP32 values of the stored A
    b_deq: np.ndarray

    def kwargs(self) -> dict:
        return {"transa": self.transa, "transb": self.transb}


def dequantized(op: BlockOperand, columnwise: bool = False, out_dtype=np.float32) -> np.ndarray:
    """The values of a stored block-scaled operand by the format's dequantize
    function, rounded to out_dtype (columnwise: MXFP8 32x1 blocks), as a matrix.
    FP32 is what the CPU path multiplies, BF16 what the CUDA emulated path does."""
    if op.scaling in ("fp8_block_1d", "fp8_block_2d"):
        dim = 1 if op.scaling == "fp8_block_1d" else 2
        out = tec.dequantize_fp8_block(op.data, op.scale_inv, block_dim=dim, layout="gemm_ready", out_dtype=out_dtype)
    elif op.scaling == "mxfp8":
        out = tec.dequantize_mxfp8(
            op.data, op.scale_inv, columnwise=columnwise, swizzled_scales=op.swizzled_scales, out_dtype=out_dtype
        )
    elif op.scaling == "nvfp4":
        scales = op.scale_inv
        if op.swizzled_scales:
            scales = tec.unswizzle_block_scales(scales)
        out = tec.dequantize_nvfp4(op.data, scales, op.amax, out_dtype=out_dtype)
    else:
        raise ValueError(f"not a block-scaled operand: {op.scaling}")
    return np.ascontiguousarray(out).reshape(-1, out.shape[-1])


def _operand(fmt: str, tensor, columnwise: bool, swizzled: bool) -> BlockOperand:
    op = tec.operand(tensor, columnwise=columnwise)
    if fmt == "nvfp4" and swizzled:  # NVFP4 quantizes compact scales; swizzle them here
        op = op._replace(scale_inv=tec.swizzle_block_scales(op.scale_inv), swizzled_scales=True)
    return op


def quantize(fmt: str, x: np.ndarray, *, weight: bool, weight_2d: bool, swizzled: bool, rht: bool = False):
    """Both copies of x in the format (weights in 2-D blocks when weight_2d)."""
    two_d = weight and weight_2d
    if fmt == "fp8_block":
        return tec.quantize_fp8_block(x, block_dim=2 if two_d else 1, rowwise=True, columnwise=True)
    if fmt == "mxfp8":
        return tec.quantize_mxfp8(x, rowwise=True, columnwise=True, use_2d_blocks=two_d, swizzled_scales=swizzled)
    return tec.quantize_nvfp4(x, rowwise=True, columnwise=True, block_2d=two_d, random_hadamard=rht and not two_d)


def linear_cases(fmt: str, x, w, dy, *, weight_2d=False, swizzled=False, rht=False) -> dict:
    """fprop, dgrad and wgrad operands of one Linear layer in format fmt.

    FP8 block and NVFP4 store columnwise copies transposed (TN everywhere);
    MXFP8 keeps them in place and says so with the trans flags.
    """
    qx = quantize(fmt, x, weight=False, weight_2d=weight_2d, swizzled=swizzled, rht=rht)
    qw = quantize(fmt, w, weight=True, weight_2d=weight_2d, swizzled=swizzled)
    qdy = quantize(fmt, dy, weight=False, weight_2d=weight_2d, swizzled=swizzled, rht=rht)

    def op(tensor, columnwise):
        o = _operand(fmt, tensor, columnwise, swizzled)
        return o, dequantized(o, columnwise)

    mx = fmt == "mxfp8"
    cases = {}
    for name, (ta, a_col), (tb, b_col), transa, transb in (
        ("fprop", (qx, False), (qw, False), False, True),
        ("dgrad", (qdy, False), (qw, True), False, not mx),
        ("wgrad", (qdy, True), (qx, True), mx, not mx),
    ):
        (a, a_deq), (b, b_deq) = op(ta, a_col), op(tb, b_col)
        cases[name] = Case(a, b, transa, transb, a_deq, b_deq)
    return cases


def random_linear(rng, t: int, k_in: int, n_out: int, hostile=None):
    """X, W, dY as FP32 (normal values with a spread of magnitudes; `hostile`,
    a function (rng, shape) -> array, replaces them when given)."""

    def one(shape):
        if hostile is not None:
            return hostile(rng, shape)
        scale = rng.choice([1e-3, 1.0, 30.0], size=(shape[0], 1))
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return one((t, k_in)), one((n_out, k_in)), one((t, n_out))


def same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    unsigned = {2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    return np.array_equal(x.view(unsigned), y.view(unsigned))
