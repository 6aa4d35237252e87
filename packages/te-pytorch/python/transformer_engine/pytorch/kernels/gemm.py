"""GEMM ops: torch.ops.te.gemm and torch.ops.te.gemm_accumulate.

Row-major semantics of te-core's te_gemm (core/include/te/gemm.h):
    D = alpha * op(A) @ op(B) (+ beta * C) (+ bias[n]) (GELU epilogue optional)
    op(A) = A.T when transa (A stored [K, M]); op(B) = B.T when transb (B stored [N, K])
    bias_grad[m] = sum_k op(A)[m, k]   (the bias gradient of a wgrad GEMM)
FP8 operands are uint8 tensors with their format code (a_dtype / b_dtype) and
an FP32 one-element scale_inv; high-precision operands pass a_dtype = -1 (the
code then comes from the torch dtype). Hopper FP8 needs the "TN" form
(transa = 0, transb = 1); other forms work too, the core transposes into its
workspace.

The workspace (CUDA only: cuBLASLt's plus room for FP8 transposes) is sized by
te_gemm_workspace_size for these exact arguments and taken from the per-stream
cache in _common (the core never allocates). `gemm_accumulate` writes into a
caller's tensor with D = C = out (beta = 1 accumulates in place): the
fuse_wgrad_accumulation path into `main_grad`.

te_gemm takes FP8 operands only with M, N and K divisible by 16 (cuBLASLt's
FP8 rule: 16-byte aligned leading dimensions; the core enforces it on every
backend). The reference's modules accept 8 tokens, so an FP8 GEMM of other
sizes runs here on copies zero-padded to multiples of 16 (_run_padded): zero
bytes are +0 in E4M3 and E5M2, so padded K adds nothing and padded rows and
columns of D are cut off; the result is the unpadded GEMM's.
"""

from __future__ import annotations

from typing import NamedTuple, Unpack

import torch
from torch import Tensor

from transformer_engine.core import lib

from ._common import (
    FLOAT32,
    FP8_CODES,
    TORCH_TO_CODE,
    check_accumulate_out,
    check_out_dtype,
    contiguous,
    desc,
    te_op,
    workspace,
)

_INPUT_TEXT = "float32, bfloat16, float16, or uint8 FP8 bytes with an FP8 dtype code"


def _operand(t: torch.Tensor, code: int, scale_inv, name: str):
    """(descriptor, scale_inv descriptor) of a GEMM operand, with checks that name it."""
    dtype = t.dtype
    if code < 0:
        code = TORCH_TO_CODE.get(dtype, -1)
        if code < 0 or dtype == torch.uint8:
            raise TypeError(f"argument '{name}' must be {_INPUT_TEXT}, got {dtype}")
    elif code not in FP8_CODES or dtype != torch.uint8:
        raise TypeError(
            f"argument '{name}' with FP8 code {code} must be uint8 bytes and the code "
            f"DType.kFloat8E4M3 (7) or DType.kFloat8E5M2 (8); got {dtype}"
        )
    if t.dim() < 2:
        raise ValueError(f"argument '{name}' must have at least 2 dims, got shape {tuple(t.shape)}")
    return desc(t, code), (None if scale_inv is None else desc(scale_inv, FLOAT32))


def _matrix(shape) -> tuple[int, int]:
    if len(shape) == 2:
        return shape[0], shape[1]
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    return rows, shape[-1]


def _out_shape(a, b, transa: bool, transb: bool) -> tuple:
    """(D's shape as a tuple of ints, m, n)."""
    a_shape, b_shape = a.shape, b.shape
    if len(a_shape) == 2 and len(b_shape) == 2:  # (the common case, without the helper calls)
        a_rows, a_cols = a_shape
        b_rows, b_cols = b_shape
    else:
        a_rows, a_cols = _matrix(a_shape)
        b_rows, b_cols = _matrix(b_shape)
    m = a_cols if transa else a_rows
    n = b_rows if transb else b_cols
    if transa or len(a_shape) == 2:
        return (m, n), m, n
    return (*a_shape[:-1], n), m, n


# te_gemm_workspace_size answers, keyed by all the size depends on (te/gemm.h:
# types, shapes and flags, never data pointers): asking the core costs a
# binding call and a plan per GEMM, a dict lookup costs far less.
_WORKSPACE_BYTES: dict[tuple, int] = {}
_MAX_CACHED_SIZES = 4096


def _workspace_bytes(key, descs, flags) -> int:
    nbytes = _WORKSPACE_BYTES.get(key)
    if nbytes is None:
        nbytes = lib.gemm_workspace_size(*descs, *flags)
        if len(_WORKSPACE_BYTES) >= _MAX_CACHED_SIZES:  # (many distinct shapes: start over)
            _WORKSPACE_BYTES.clear()
        _WORKSPACE_BYTES[key] = nbytes
    return nbytes


_FP8_MULTIPLE = 16  # te_gemm's FP8 rule for M, N and K (module docstring)


def _pad_to(t: Tensor, rows: int, cols: int) -> Tensor:
    """t (2-D) zero-padded at the end to [rows, cols]."""
    out = t.new_zeros(rows, cols)
    out[: t.shape[0], : t.shape[1]] = t
    return out


def _up(x: int) -> int:
    return -(-x // _FP8_MULTIPLE) * _FP8_MULTIPLE


class GemmOptions(NamedTuple):
    """The keyword arguments gemm and gemm_accumulate share (a keyword group of
    _common.te_op): the operands' FP8 codes (-1: high precision) and scale_invs,
    their layout, whether to return the bias gradient, cuBLASLt's split accumulator."""

    a_dtype: int = -1
    a_scale_inv: Tensor | None = None
    b_dtype: int = -1
    b_scale_inv: Tensor | None = None
    transa: bool = False
    transb: bool = False
    bias_grad: bool = False
    use_split_accumulator: bool = True


def _run_padded(a, b, d, o: GemmOptions, bias, pre_gelu, bias_grad, alpha, beta, mnk):
    """_run on operands zero-padded to multiples of 16; writes the unpadded result into d (and pre_gelu, bias_grad)."""
    m, n, k = mnk
    mp, np_, kp = _up(m), _up(n), _up(k)
    transa, transb = o.transa, o.transb
    a2 = a.reshape(-1, a.shape[-1])
    b2 = b.reshape(-1, b.shape[-1])
    a2 = _pad_to(a2, kp, mp) if transa else _pad_to(a2, mp, kp)
    b2 = _pad_to(b2, np_, kp) if transb else _pad_to(b2, kp, np_)
    d2 = d.view(m, n)
    dp = _pad_to(d2, mp, np_) if beta != 0.0 else d.new_empty(mp, np_)
    bias_p = None if bias is None else _pad_to(bias.reshape(1, n), 1, np_).reshape(np_)
    pre_p = None if pre_gelu is None else pre_gelu.new_empty(mp, np_)
    grad_p = None if bias_grad is None else bias_grad.new_empty(mp)
    _run(a2, b2, dp, o, bias_p, pre_p, grad_p, alpha, beta)
    d2.copy_(dp[:m, :n])
    if pre_gelu is not None:
        pre_gelu.copy_(pre_p[:m, :n])
    if bias_grad is not None:
        bias_grad.copy_(grad_p[:m])


def _needs_padding(a, b, o: GemmOptions):
    """(m, n, k) when an FP8 GEMM's sizes break te_gemm's multiple-of-16 rule, else None."""
    if o.a_dtype not in FP8_CODES and o.b_dtype not in FP8_CODES:
        return None
    _, m, n = _out_shape(a, b, o.transa, o.transb)
    k = a.numel() // a.shape[-1] if o.transa else a.shape[-1]
    if m % _FP8_MULTIPLE or n % _FP8_MULTIPLE or k % _FP8_MULTIPLE:
        return m, n, k
    return None


def _run(a, b, d, o: GemmOptions, bias, pre_gelu, bias_grad, alpha, beta):
    """te_gemm into d (and pre_gelu, bias_grad: None or tensors to write)."""
    a_dtype, a_scale_inv, b_dtype, b_scale_inv, transa, transb, _, use_split_accumulator = o
    if a_dtype >= 0 or b_dtype >= 0:  # (FP8: the size rule; high precision skips the call)
        mnk = _needs_padding(a, b, o)
        if mnk is not None:
            _run_padded(a, b, d, o, bias, pre_gelu, bias_grad, alpha, beta, mnk)
            return
    if not a.is_contiguous():
        a = a.contiguous()
    if not b.is_contiguous():
        b = b.contiguous()
    a_desc, a_sdesc = _operand(a, a_dtype, a_scale_inv, "a")
    b_desc, b_sdesc = _operand(b, b_dtype, b_scale_inv, "b")
    d_desc = desc(d, TORCH_TO_CODE[d.dtype])
    c_desc = d_desc if beta != 0.0 else None
    if bias is not None:  # (a contiguous copy must live until the call: descriptors are raw pointers)
        bias = contiguous(bias)
    bias_desc = None if bias is None else desc(bias, TORCH_TO_CODE[bias.dtype])
    pre_desc = None if pre_gelu is None else desc(pre_gelu, TORCH_TO_CODE[pre_gelu.dtype])
    grad_desc = None if bias_grad is None else desc(bias_grad, TORCH_TO_CODE[bias_grad.dtype])
    # te_gemm's arguments: the descriptors (C, then no D scale / amax), then the flags.
    descs = (a_desc, b_desc, d_desc, a_sdesc, b_sdesc, c_desc, None, None, bias_desc, pre_desc, grad_desc)
    flags = (alpha, beta, transa, transb, use_split_accumulator)
    ws = None
    stream = 0
    device = a.get_device()  # (-1 on the CPU; an int, cheaper than a.device.index)
    if device >= 0:
        stream = torch._C._cuda_getCurrentRawStream(device)
        key = (
            a.shape,
            b.shape,
            a_desc.dtype,
            b_desc.dtype,
            d.dtype,
            transa,
            transb,
            None if bias is None else bias.dtype,
            pre_gelu is None,
            bias_grad is None,
            beta != 0.0,
            use_split_accumulator,
            device,
        )
        ws = workspace(_workspace_bytes(key, descs, flags), a, stream)
    lib.gemm(*descs, ws, *flags, stream)


def _gemm_shapes(a):
    shape, m, n = _out_shape(a.a, a.b, a.transa, a.transb)
    if not hasattr(a, "out"):
        pre = ((m, n), a.out_dtype) if a.gelu else None
        return (shape, a.out_dtype), pre, (((m,), a.out_dtype) if a.bias_grad else None)
    return ((m,), a.out.dtype) if a.bias_grad else None


@te_op("gemm", shapes=_gemm_shapes)
def gemm(
    a: Tensor,
    b: Tensor,
    *,
    out_dtype: torch.dtype = torch.float32,
    bias: Tensor | None = None,
    gelu: bool = False,
    alpha: float = 1.0,
    **options: Unpack[GemmOptions],
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """D = alpha * op(a) @ op(b) (+ bias) (GELU), see the module docstring;
    the other keyword arguments are GemmOptions' fields.

    Returns (D, pre_gelu_out | None, bias_grad | None); the last two have
    out_dtype. FP8 operands: uint8 bytes, their code in a_dtype/b_dtype and
    their scale_inv.
    """
    check_out_dtype(out_dtype)
    o = GemmOptions(**options)
    shape, m, n = _out_shape(a, b, o.transa, o.transb)
    # (sizes as separate ints: torch parses them faster than a tuple; see cast._prepared_outputs)
    device = a.device
    d = torch.empty(*shape, dtype=out_dtype, device=device)
    pre = torch.empty(m, n, dtype=out_dtype, device=device) if gelu else None
    grad = torch.empty(m, dtype=out_dtype, device=device) if o.bias_grad else None
    _run(a, b, d, o, bias, pre, grad, alpha, 0.0)
    return d, pre, grad


@te_op("gemm_accumulate", mutates_args=("out",), shapes=_gemm_shapes)
def gemm_accumulate(
    a: Tensor,
    b: Tensor,
    out: Tensor,
    *,
    beta: float = 1.0,
    **options: Unpack[GemmOptions],
) -> Tensor | None:
    """out = op(a) @ op(b) + beta * out, in place (beta = 0 overwrites); the
    other keyword arguments are GemmOptions' fields, as in `gemm`.

    Returns bias_grad (out's dtype) or None.
    """
    o = GemmOptions(**options)
    _, m, n = _out_shape(a, b, o.transa, o.transb)
    check_accumulate_out(out, m, n)
    grad = torch.empty(m, dtype=out.dtype, device=a.device) if o.bias_grad else None
    _run(a, b, out, o, None, None, grad, 1.0, beta)
    return grad
