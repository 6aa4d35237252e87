"""layernorm_dense: y = norm(x) @ kernel (+ bias) in one custom VJP.

    y[..., n] = sum_k norm(x)[..., k] kernel[k, n] + bias[n]     norm: LayerNorm or RMSNorm (layernorm.py)

The GEMMs are dense's (transformer_engine.jax.dense, the same TN-form FP8 GEMMs
and the same delayed-scaling convention: the updated quantizer set is the
set's cotangent). What the fusion adds: under an FP8 quantizer set the norm
kernel writes the FP8 copy of its output itself, so the high-precision norm
output never exists:

    delayed scaling   q = fp8(y_fp32 * scale) inside the norm kernel, amax recorded there
    current scaling   the norm in FP32, then the cast with that output's own amax

(for float32 x both equal quantizing the stored norm output, so the layer equals
dense(layernorm(x), ...) bit for bit; for 16-bit x the fusion skips one rounding).
The transposed (columnwise) copy the wgrad GEMM reads is the FP8 rowwise copy
transposed (exact). The backward runs dense's two backward GEMMs, then the norm's
backward kernel on dY K^T.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from ._partition import active_mesh
from .dense import _check_arguments, _dense_bwd, _dense_fwd, fp8_forward
from .layernorm import check_norm_arguments, norm_backward, norm_forward
from .quantize import DelayedScaleQuantizer, QuantizerSet, noop_quantizer_set
from .quantize.quantizer import ScaledTensor, amax_reduction_active


def layernorm_dense(
    x,
    kernel,
    gamma,
    beta,
    bias=None,
    norm_type: str = "layernorm",
    zero_centered_gamma: bool = False,
    epsilon: float = 1e-6,
    layernorm_input_axes=None,
    dot_input_axes=None,
    kernel_axes=None,
    batch_first: bool = True,
    quantizer_set: QuantizerSet = noop_quantizer_set,
):
    """``norm(x [..., in]) @ kernel [in, *out] (+ bias [*out]) -> [..., *out]`` in x's type.

    gamma [in] and beta [in] (None for norm_type 'rmsnorm') as in layernorm.layernorm.
    kernel and bias are cast to x's type (their gradients come back in their own
    types), as dense does. quantizer_set: noop_quantizer_set or a set from
    QuantizerFactory.create_set(recipe); FP8 needs the rows of x, in and
    prod(out) to be multiples of 16. layernorm_input_axes and kernel_axes: the
    logical axes of x and kernel; with a mesh in scope the norm runs on x's shard
    (sequence parallel when x's sequence is on tpsp), its output is all-gathered for
    a column-parallel GEMM and the kernel's FSDP dims are gathered (docs/te_jax.md).
    dot_input_axes (the gathered layout follows from the kernel) and batch_first
    are accepted.
    """
    norm_type = check_norm_arguments(norm_type, beta, zero_centered_gamma)
    _check_arguments(x, kernel, bias, None, quantizer_set)
    mesh = active_mesh()
    if mesh is not None:
        from ._sharded_ops import sharded_layernorm_dense

        b = None if bias is None else bias.astype(x.dtype)
        norm_args = (norm_type, zero_centered_gamma, float(epsilon))
        return sharded_layernorm_dense(
            mesh, x, kernel.astype(x.dtype), gamma, beta, b, quantizer_set, norm_args, layernorm_input_axes, kernel_axes
        )
    in_features, out_shape = kernel.shape[0], kernel.shape[1:]
    x2 = x.reshape(-1, in_features)
    kernel2 = kernel.astype(x.dtype).reshape(in_features, -1)
    bias1 = None if bias is None else bias.astype(x.dtype).reshape(-1)
    y = _layernorm_dense(x2, kernel2, gamma, beta, bias1, quantizer_set, norm_type, zero_centered_gamma, float(epsilon))
    return y.reshape(*x.shape[:-1], *out_shape)


def quantized_norm(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer):
    """The norm of x [M, H] written in FP8 by `quantizer`'s scaling.

    Returns (ScaledTensor with the rowwise [M, H] and columnwise [H, M] copies, mu,
    rsigma, the quantizer afterwards: a delayed one with the output's amax
    recorded, as its quantize() would leave it)."""
    if isinstance(quantizer, DelayedScaleQuantizer):
        out = norm_forward(
            x,
            gamma,
            beta,
            norm_type,
            zero_centered_gamma,
            epsilon,
            out_dtype=quantizer.q_dtype,
            scale=quantizer.scale,
            amax=quantizer.amax_history[:1],
        )
        quantizer = quantizer.record(out.amax)
    elif amax_reduction_active() or not quantizer.scaling_mode.is_tensor_scaling():
        # (block formats: the norm in FP32, then the block cast; no fused block-scaled norm yet)
        # Partitioned: the FP32 norm, then the cast with the amax of every shard (the fused
        # current-scaling norm does the same with the local amax only).
        out = norm_forward(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, out_dtype=jnp.float32)
        q, quantizer = quantizer.quantize(out.y, rowwise=True, columnwise=True)
        return q, out.mu, out.rsigma, quantizer
    else:
        out = norm_forward(
            x,
            gamma,
            beta,
            norm_type,
            zero_centered_gamma,
            epsilon,
            out_dtype=quantizer.q_dtype,
            force_pow_2_scales=quantizer.power_2_scale,
            amax_epsilon=quantizer.amax_epsilon,
        )
    return ScaledTensor(out.y, out.y.T, out.scale_inv), out.mu, out.rsigma, quantizer


def norm_then_gemm_forward(x, kernel, gamma, beta, bias, quantizer_set, norm_type, zero_centered_gamma, epsilon):
    """The forward of norm -> dense: (y, norm residuals, dense residuals)."""
    if quantizer_set.is_noop:
        out = norm_forward(x, gamma, beta, norm_type, zero_centered_gamma, epsilon)
        y, dense_residuals = _dense_fwd(out.y, kernel, bias, quantizer_set)
        return y, (x, out.mu, out.rsigma, gamma), dense_residuals
    qx, mu, rsigma, x_quantizer = quantized_norm(
        x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer_set.x
    )
    y, dense_residuals = fp8_forward(qx, x_quantizer, kernel, bias, quantizer_set, x.dtype)
    return y, (x, mu, rsigma, gamma), dense_residuals


@partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _layernorm_dense(x, kernel, gamma, beta, bias, quantizer_set, norm_type, zero_centered_gamma, epsilon):
    return _layernorm_dense_fwd(x, kernel, gamma, beta, bias, quantizer_set, norm_type, zero_centered_gamma, epsilon)[0]


def _layernorm_dense_fwd(x, kernel, gamma, beta, bias, quantizer_set, norm_type, zero_centered_gamma, epsilon):
    y, norm_residuals, dense_residuals = norm_then_gemm_forward(
        x, kernel, gamma, beta, bias, quantizer_set, norm_type, zero_centered_gamma, epsilon
    )
    return y, (norm_residuals, dense_residuals)


def _layernorm_dense_bwd(norm_type, zero_centered_gamma, epsilon, residuals, dy):
    del epsilon  # the norm's backward reads rsigma
    (x, mu, rsigma, gamma), dense_residuals = residuals
    dnorm, dkernel, dbias, quantizer_set = _dense_bwd(dense_residuals, dy)
    dx, dgamma, dbeta = norm_backward(dnorm, x, mu, rsigma, gamma, norm_type, zero_centered_gamma)
    return dx, dkernel, dgamma, dbeta, dbias, quantizer_set


_layernorm_dense.defvjp(_layernorm_dense_fwd, _layernorm_dense_bwd)
