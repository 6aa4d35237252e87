"""dense: y = x @ kernel (+ bias), FP8 or high precision, with a custom VJP.

    y[..., n] = sum_k x[..., k] kernel[k, n] + bias[n]       kernel stored [in, out] (Flax's layout)

With an FP8 quantizer set the three GEMMs of a dense layer run on FP8
operands (te_gemm, FP32 accumulation) and return x's type:

    forward  Y  = Q(X) Q(K)          x and kernel quantizers (E4M3)
    dgrad    dX = Q(dY) Q(K)^T       dgrad quantizer on dY (E5M2 under Format.HYBRID)
    wgrad    dW = Q(X)^T Q(dY)
    bias     db = sum of dY over the rows (high precision, FP32 sums)

Every GEMM is in te_gemm's "TN" form (transa=False, transb=True: both
operands K-contiguous), which FP8 tensor cores take without a transpose:
each tensor is quantized once into a rowwise copy and a columnwise
(transposed) copy, and each GEMM picks the copy it needs. Under MXFP8 and FP8
block scaling the GEMMs are te_gemm_block's on the block-scaled copies (blocks
along each GEMM's K: te/gemm_block.h's Linear table; emulated where the GPU has
no kernel for the format).

Delayed-scaling state leaves a training step as the *gradient* of the
quantizer set, the reference library's convention: the forward rule
quantizes with the current scales, records the amaxes and runs the recipe
update of the x and kernel quantizers; the backward rule does the same for
the dgrad quantizer and returns the updated set as the quantizer set's
cotangent. So

    grads, new_quantizer_set = jax.grad(loss, argnums=(0, 1))(params, quantizer_set)

gives the state for the next step (the next forward uses the scales computed
from this step's amaxes). A plain call to dense (no differentiation) leaves
no updated state behind: inference does not advance the recipe.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ._partition import active_mesh
from .cpp_extensions import gemm, gemm_block
from .cpp_extensions._checks import HIGH_PRECISION, check_dtype
from .cpp_extensions.block import SCALING_MXFP8
from .quantize import QuantizerSet, noop_quantizer_set
from .quantize.quantizer import BlockScaledTensor, ScaledTensor
from .quantize.scaling_modes import ScalingMode


def dense(
    x,
    kernel,
    bias=None,
    contracting_dims=None,
    transpose_batch_sequence: bool = False,
    input_axes=None,
    kernel_axes=None,
    output_axes=None,
    quantizer_set=noop_quantizer_set,
):
    """``x [..., in] @ kernel [in, *out] (+ bias [*out]) -> [..., *out]`` in x's type.

    contracting_dims: ((x.ndim - 1,), (0,)) (the default, None) is the only one
    supported so far. kernel and bias are cast to x's type first (as Flax's
    DenseGeneral does); their gradients come back in their own types.
    quantizer_set: noop_quantizer_set (high-precision GEMMs) or a set from
    QuantizerFactory.create_set(recipe). With FP8, the rows of x (the product of
    its leading dims), in and out must be multiples of 16 (te_gemm's rule) — on
    each shard when partitioned.
    input_axes / kernel_axes / output_axes: logical axes of x, kernel and y (te's
    names from transformer_engine.jax.sharding or flax's logical names). With a
    mesh in scope and a MeshResource naming its axes, the GEMMs partition by them
    (column / row tensor parallel, FSDP, data parallel; docs/te_jax.md); without
    them x's first dim is the batch and the kernel is replicated. Ignored on one
    device. transpose_batch_sequence: accepted (the layout is read from the axes).
    """
    _check_arguments(x, kernel, bias, contracting_dims, quantizer_set)
    mesh = active_mesh()
    if mesh is not None:
        from ._sharded_ops import sharded_dense  # the partitioned form (it imports this module)

        b = None if bias is None else bias.astype(x.dtype)
        return sharded_dense(mesh, x, kernel.astype(x.dtype), b, quantizer_set, input_axes, kernel_axes, output_axes)
    in_features, out_shape = kernel.shape[0], kernel.shape[1:]
    # 2-D inside the custom VJP; reshapes of contiguous arrays are free in XLA.
    x2 = x.reshape(-1, in_features)
    kernel2 = kernel.astype(x.dtype).reshape(in_features, -1)
    bias1 = None if bias is None else bias.astype(x.dtype).reshape(-1)
    y = _dense(x2, kernel2, bias1, quantizer_set)
    return y.reshape(*x.shape[:-1], *out_shape)


@jax.custom_vjp
def _dense(x, kernel, bias, quantizer_set):
    return _dense_fwd(x, kernel, bias, quantizer_set)[0]


def _dense_fwd(x, kernel, bias, quantizer_set):
    if quantizer_set.is_noop:
        return gemm(x, kernel, bias=bias), (x, kernel, bias, quantizer_set)
    qx, x_quantizer = quantizer_set.x.quantize(x, rowwise=True, columnwise=True)
    return fp8_forward(qx, x_quantizer, kernel, bias, quantizer_set, x.dtype)


def fp8_forward(qx, x_quantizer, kernel, bias, quantizer_set, out_dtype):
    """The FP8 forward rule from x's FP8 copies: qx (rowwise and columnwise) and
    x_quantizer (the x quantizer with x's amax recorded). layernorm_dense and
    layernorm_mlp call it with copies that a fused norm or activation wrote.
    Returns (y, residuals of _dense_bwd)."""
    qk, k_quantizer = quantizer_set.kernel.quantize(kernel, rowwise=True, columnwise=True)
    new_set = QuantizerSet(x_quantizer.update(), k_quantizer.update(), quantizer_set.dgrad)
    if isinstance(qx, BlockScaledTensor):
        # Y = X K: X's rowwise copy (blocks along in) and K's columnwise one (blocks down in).
        y = _block_gemm(qx, True, qk, False, out_dtype, bias)
        return y, (qx.only(rowwise=False), qk.only(rowwise=True), bias, new_set)
    # Y [M, out] = X [M, in] . K: B is K's columnwise copy, stored [out, in].
    y = _fp8_gemm(qx.rowwise, qx.scale_inv, qk.columnwise, qk.scale_inv, bias=bias, out_dtype=out_dtype)
    # Saved for backward: the copies the two backward GEMMs read, in FP8.
    x_saved = ScaledTensor(None, qx.columnwise, qx.scale_inv)
    k_saved = ScaledTensor(qk.rowwise, None, qk.scale_inv)
    return y, (x_saved, k_saved, bias, new_set)


def _dense_bwd(residuals, dy):
    x_saved, k_saved, bias, quantizer_set = residuals
    if quantizer_set.is_noop:
        dx, dw = backward_gemms(dy, x_saved, k_saved)
    else:
        qdy, dgrad_quantizer = quantizer_set.dgrad.quantize(dy, rowwise=True, columnwise=True)
        dx, dw = backward_gemms(qdy, x_saved, k_saved, out_dtype=dy.dtype)
        quantizer_set = QuantizerSet(quantizer_set.x, quantizer_set.kernel, dgrad_quantizer.update())
    dbias = None if bias is None else jnp.sum(dy, axis=0, dtype=jnp.float32).astype(bias.dtype)
    # The quantizer set's "gradient" is its updated state (see the module docstring).
    return dx, dw, dbias, quantizer_set


def backward_gemms(dy, x_saved, k_saved, out_dtype=None):
    """(dX, dW) from the forward's residuals: high-precision GEMMs when dy is an
    array (x_saved and k_saved then are too), FP8 GEMMs when dy is dY's
    ScaledTensor (rowwise and columnwise) and the residuals are fp8_forward's."""
    if isinstance(dy, BlockScaledTensor):
        # dX = dY K^T: dY's and K's rowwise copies (blocks along out); dW = X^T dY:
        # X's and dY's columnwise copies (blocks down the tokens).
        return _block_gemm(dy, True, k_saved, True, out_dtype), _block_gemm(x_saved, False, dy, False, out_dtype)
    if not isinstance(dy, ScaledTensor):
        return gemm(dy, k_saved, transb=True), gemm(x_saved, dy, transa=True)  # dY K^T, X^T dY
    # dX [M, in] = dY [M, out] . K^T: B is K's rowwise copy, stored [in, out].
    dx = _fp8_gemm(dy.rowwise, dy.scale_inv, k_saved.rowwise, k_saved.scale_inv, out_dtype=out_dtype)
    # dW [in, out] = X^T . dY: A is X's columnwise copy [in, M], B is dY's [out, M].
    dw = _fp8_gemm(x_saved.columnwise, x_saved.scale_inv, dy.columnwise, dy.scale_inv, out_dtype=out_dtype)
    return dx, dw


_dense.defvjp(_dense_fwd, _dense_bwd)


def _block_gemm(a: BlockScaledTensor, a_rowwise: bool, b: BlockScaledTensor, b_rowwise: bool, out_dtype, bias=None):
    """The GEMM of a dense layer on the given copies of two block-scaled tensors
    (te/gemm_block.h's Linear table, kernels stored [in, out]): the product of A's
    copy read as [M, K] and B's copy read as [K, N], each with its blocks along K.
    MXFP8 copies keep their tensor's shape, so the flags say which copy each is
    (transa: A's columnwise copy, stored [K, M]; transb: B's rowwise copy, stored
    [N, K]); FP8-block columnwise copies are stored transposed, so every such GEMM
    is TN (A stored [M, K], B stored [N, K])."""
    a_data, a_si = (a.rowwise, a.rowwise_scale_inv) if a_rowwise else (a.columnwise, a.columnwise_scale_inv)
    b_data, b_si = (b.rowwise, b.rowwise_scale_inv) if b_rowwise else (b.columnwise, b.columnwise_scale_inv)
    if a.scaling == SCALING_MXFP8:
        transa, transb = not a_rowwise, b_rowwise
    else:
        transa, transb = False, True
    a_amax = a.rowwise_amax if a_rowwise else a.columnwise_amax  # (NVFP4; None otherwise)
    b_amax = b.rowwise_amax if b_rowwise else b.columnwise_amax
    return gemm_block(
        a_data, a_si, b_data, b_si, a_scaling=a.scaling, b_scaling=b.scaling, transa=transa, transb=transb,
        out_dtype=out_dtype, bias=bias, a_amax=a_amax, b_amax=b_amax,
    )  # fmt: skip


def _fp8_gemm(a, a_scale_inv, b, b_scale_inv, *, out_dtype, bias=None):
    """op(A) op(B) in te_gemm's TN form: A stored [M, K], B stored [N, K] (FP8, each with its scale_inv)."""
    return gemm(a, b, transb=True, a_scale_inv=a_scale_inv, b_scale_inv=b_scale_inv, bias=bias, out_dtype=out_dtype)


def _check_arguments(x, kernel, bias, contracting_dims, quantizer_set) -> None:
    """Trace-time checks, each naming the argument and the rule."""
    check_dtype(x, "x", HIGH_PRECISION)
    check_dtype(kernel, "kernel", HIGH_PRECISION)
    if x.ndim < 1:
        raise ValueError("argument 'x' must have at least 1 dimension, got a scalar")
    if kernel.ndim < 2:
        raise ValueError(f"argument 'kernel' must be [in, out...] (at least 2 dims), got shape {tuple(kernel.shape)}")
    default = ((x.ndim - 1,), (0,))
    if contracting_dims is not None and _normalized(contracting_dims, x.ndim, kernel.ndim) != default:
        raise ValueError(
            f"argument 'contracting_dims' must be ((x.ndim - 1,), (0,)) = {default} (the only contraction "
            f"supported so far), got {contracting_dims!r}"
        )
    if x.shape[-1] != kernel.shape[0]:
        raise ValueError(
            f"arguments 'x' and 'kernel' must share the contracted dimension: x is {tuple(x.shape)}, "
            f"kernel is {tuple(kernel.shape)} (x's last dim must equal kernel's first)"
        )
    if bias is not None:
        check_dtype(bias, "bias", HIGH_PRECISION)
        if tuple(bias.shape) != tuple(kernel.shape[1:]):
            raise ValueError(
                f"argument 'bias' must have shape {tuple(kernel.shape[1:])} (kernel's output dims), "
                f"got {tuple(bias.shape)}"
            )
    if not isinstance(quantizer_set, QuantizerSet):
        raise TypeError(f"argument 'quantizer_set' must be a QuantizerSet, got {type(quantizer_set).__name__}")
    members = (quantizer_set.x, quantizer_set.kernel, quantizer_set.dgrad)
    if any(q is None for q in members) and not quantizer_set.is_noop:
        raise ValueError("argument 'quantizer_set' must have all of x, kernel and dgrad quantizers, or none")
    if not quantizer_set.is_noop:
        rows, in_features, out_features = math.prod(x.shape[:-1]), kernel.shape[0], math.prod(kernel.shape[1:])
        # MXFP8: whole 32-element blocks in both directions of x, kernel and dY.
        multiple, rule = (
            (32, "MXFP8's 32-element blocks")
            if quantizer_set.scaling_mode is ScalingMode.MXFP8_1D_SCALING
            else (16, "te_gemm's rule")
        )
        if rows % multiple or in_features % multiple or out_features % multiple:
            raise ValueError(
                f"FP8 dense needs multiples of {multiple} ({rule}): argument 'x' has "
                f"{rows} rows and {in_features} features, argument 'kernel' {out_features} outputs"
            )


def _normalized(dims, x_ndim: int, k_ndim: int):
    """((x dims), (kernel dims)) with negative dims made positive, or None when malformed."""

    def positive(ds, ndim):
        ds = tuple(int(d) for d in ds)
        if any(not -ndim <= d < ndim for d in ds):
            raise ValueError
        return tuple(d % ndim for d in ds)

    try:
        x_dims, k_dims = dims
        return (positive(x_dims, x_ndim), positive(k_dims, k_ndim))
    except (TypeError, ValueError):
        return None
