"""GEMM operands of every recipe behind one interface (used by _linear_fn.py
and the modules built on it).

    op = quantize_operand(quantizer, x, rowwise=..., columnwise=...)
    y  = operand_gemm(op_a, a_columnwise, op_b, b_columnwise, out_dtype=...)

An Operand holds the rowwise and/or columnwise copies of one quantized
tensor viewed as a matrix. operand_gemm computes op(A) @ op(B)^T in the
TN convention of a Linear layer (A [M, K], B [N, K] as matrices):
    fprop  Y  = X W^T   A = X rowwise,   B = W rowwise
    dgrad  dX = dY W    A = dY rowwise,  B = W columnwise
    wgrad  dW = dY^T X  A = dY columnwise, B = X columnwise
Per-tensor FP8 runs kernels.gemm (columnwise copies are [K, M] transposes).
Block formats run kernels.gemm_block: FP8 block and NVFP4 store columnwise
copies transposed (TN as above); MXFP8 does not transpose, so the flags
transa = (A is columnwise) and transb = (B is rowwise) say which copy each
operand is. Where the device has no native kernel (MXFP8 and NVFP4 on
Hopper, every block format on the CPU) the core dequantizes the operands and
runs a dense GEMM; the first such GEMM of each format warns once.
"""

from __future__ import annotations

import warnings

import torch

from .. import kernels
from ..tensor import Float8BlockwiseQTensor, Float8CurrentScalingQuantizer, Float8Tensor, MXFP8Tensor, NVFP4Tensor
from ..tensor._block_tensor import BlockQuantizer

_WARNED: set = set()
_NAMES = {"mxfp8": "MXFP8", "fp8_block": "FP8 block-scaled", "nvfp4": "NVFP4"}
_BLOCK_KINDS = {MXFP8Tensor: "mxfp8", Float8BlockwiseQTensor: "fp8_block", NVFP4Tensor: "nvfp4"}


class Operand:
    """kind: "fp8" (per-tensor) or a block quantizer's KIND; fields: the
    tensors and settings (per-tensor: row, col, scale_inv, code; block: the
    tensor class's constructor fields); fmt: the block tensor class."""

    __slots__ = ("fields", "fmt", "kind")

    def __init__(self, kind: str, fields: dict, fmt=None) -> None:
        self.kind = kind
        self.fields = fields
        self.fmt = fmt

    def tensors(self) -> list:
        """The tensor fields, for ctx.save_for_backward (see with_tensors)."""
        return [v for v in self.fields.values() if isinstance(v, torch.Tensor)]

    def with_tensors(self, tensors) -> Operand:
        """This operand with its tensor fields replaced, in tensors()'s order."""
        f = self.fields
        if self.kind == "fp8" and f["row"] is None and len(tensors) == 2:  # (the columnwise copy kept: the usual case)
            return Operand("fp8", {"row": None, "col": tensors[0], "scale_inv": tensors[1], "code": f["code"]})
        it = iter(tensors)
        fields = {k: (next(it) if isinstance(v, torch.Tensor) else v) for k, v in f.items()}
        return Operand(self.kind, fields, self.fmt)

    def drop(self, *, rowwise: bool = False, columnwise: bool = False) -> Operand:
        """A copy without the named copies (what backward does not need is not kept)."""
        if self.kind == "fp8":  # (the four fields written out: this runs for every operand of every step)
            f = self.fields
            fields = {
                "row": None if rowwise else f["row"],
                "col": None if columnwise else f["col"],
                "scale_inv": f["scale_inv"],
                "code": f["code"],
            }
        else:
            fields = {
                k: (None if (rowwise and "rowwise" in k) or (columnwise and "columnwise" in k) else v)
                for k, v in self.fields.items()
            }
        return Operand(self.kind, fields, self.fmt)


# Current scaling takes the amax of a tensor that a norm or activation kernel
# writes from that kernel (fused_amax), instead of a separate pass over the
# tensor. The results are bit-identical either way (the kernels' amax is that of
# the stored values); False restores the separate pass (the tests compare both).
FUSE_AMAX = True

# LayerNormMLP's backward under per-tensor FP8 (delayed and current scaling)
# takes fc2's wgrad operand, act(h) quantized columnwise with the forward's
# scale, from the activation backward's own pass over h
# (kernels.activation_bwd_fwd_columnwise) instead of a separate recompute pass.
# Bit-identical either way; False restores the separate pass (tests, benches).
FUSE_ACT_RECOMPUTE = True


def fused_amax(quantizer, like: torch.Tensor) -> torch.Tensor | None:
    """The FP32 [1] buffer the kernel producing x (on like's device) should
    max-accumulate max|x| into, to pass to quantize_operand(..., amax=); None
    where the quantizer does not take it (not current scaling, or FUSE_AMAX off)."""
    if not FUSE_AMAX or type(quantizer) is not Float8CurrentScalingQuantizer:
        return None
    return quantizer.fused_amax_buffer(like)


def quantize_operand(quantizer, x: torch.Tensor, *, rowwise: bool, columnwise: bool, amax=None) -> Operand:
    """The Operand of x under `quantizer` (per-tensor FP8 or block) with the asked copies.
    amax: max|x| from the kernel that wrote x (fused_amax), or None."""
    if isinstance(quantizer, BlockQuantizer):
        return Operand(quantizer.KIND, quantizer.quantize_fields(x, rowwise, columnwise), quantizer.TENSOR)
    if amax is not None:
        row, col, scale_inv = quantizer.quantize_parts_with_amax(x, amax, rowwise, columnwise)
    else:
        row, col, scale_inv = quantizer.quantize_parts(x, rowwise, columnwise)
    return Operand("fp8", {"row": row, "col": col, "scale_inv": scale_inv, "code": int(quantizer.dtype)})


def tensor_operand(t, *, columnwise: bool) -> Operand:
    """The Operand of a quantized tensor's own copies (a weight made by
    quantized_model_init): no requantization. columnwise: the transposed GEMMs
    need that copy; per-tensor FP8 builds it from the bytes (exact, kept on
    the tensor), the block formats must have been quantized with it."""
    if isinstance(t, Float8Tensor):
        if columnwise and t._transpose is None:
            t.update_usage(columnwise_usage=True)
        return Operand(
            "fp8", {"row": t._data, "col": t._transpose, "scale_inv": t._scale_inv, "code": int(t._fp8_dtype)}
        )
    if columnwise and not t.has(True):
        raise RuntimeError(
            f"this {type(t).__name__} weight has no columnwise copy (it was created under quantized_model_init "
            "with gradients disabled, for inference), so no input gradient can be computed through it; "
            "create the module with gradients enabled to train it"
        )
    return Operand(_BLOCK_KINDS[type(t)], t.fields(), type(t))


def _warn_emulated(kind: str, device: torch.device) -> None:
    if kind in _WARNED:
        return
    _WARNED.add(kind)
    where = "the CPU" if device.type == "cpu" else f"this GPU ({torch.cuda.get_device_name(device)})"
    warnings.warn(
        f"{where} has no native {_NAMES[kind]} GEMM for these operands: the GEMM is emulated by "
        "dequantizing its operands and running a dense GEMM (BF16 on CUDA, FP32 on the CPU); results "
        "match the quantized values, speed does not. (Shown once per format.)",
        stacklevel=4,
    )


def _fp8_args(op: Operand, columnwise: bool, name: str):
    data = op.fields["col" if columnwise else "row"]
    if data is None:
        raise RuntimeError(f"operand '{name}' has no {'columnwise' if columnwise else 'rowwise'} copy")
    return data, op.fields["code"], op.fields["scale_inv"]


def operand_gemm(
    a: Operand,
    a_columnwise: bool,
    b: Operand,
    b_columnwise: bool,
    *,
    out_dtype,
    bias=None,
    use_split_accumulator: bool = True,
    out: torch.Tensor | None = None,
    beta: float = 0.0,
):
    """op(A) @ op(B)^T (+ bias) as a new [M, N] tensor, or accumulated into `out`
    (out = result + beta * out; returns None) -- see the module docstring."""
    if a.kind != b.kind:
        raise ValueError(f"GEMM operands of different formats: {a.kind} and {b.kind}")
    if a.kind == "fp8":
        ad, ac, asi = _fp8_args(a, a_columnwise, "a")
        bd, bc, bsi = _fp8_args(b, b_columnwise, "b")
        kw = {"a_dtype": ac, "a_scale_inv": asi, "b_dtype": bc, "b_scale_inv": bsi, "transb": True}
        if out is not None:
            kernels.gemm_accumulate(ad, bd, out, beta=beta, use_split_accumulator=use_split_accumulator, **kw)
            return None
        return kernels.gemm(ad, bd, out_dtype=out_dtype, bias=bias, use_split_accumulator=use_split_accumulator, **kw)[
            0
        ]
    a_args = a.fmt.gemm_args(a.fields, a_columnwise)
    b_args = b.fmt.gemm_args(b.fields, b_columnwise)
    for name, args, col in (("a", a_args, a_columnwise), ("b", b_args, b_columnwise)):
        if args[0] is None:
            raise RuntimeError(f"operand '{name}' has no {'columnwise' if col else 'rowwise'} copy")
    mx = a.kind == "mxfp8"
    trans = {"transa": mx and a_columnwise, "transb": not (mx and b_columnwise)}
    if out is not None:
        path = kernels.gemm_block_accumulate(
            a_args, b_args, out, beta=beta, use_split_accumulator=use_split_accumulator, **trans
        )
        result = None
    else:
        result, path = kernels.gemm_block(
            a_args, b_args, out_dtype=out_dtype, bias=bias, use_split_accumulator=use_split_accumulator, **trans
        )
    if path == "emulated":
        _warn_emulated(a.kind, a_args[0].device)
    return result
