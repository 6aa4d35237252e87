"""layernorm_mlp: norm -> FC1 -> activation -> FC2 in one custom VJP.

    h = norm(x) @ W1 + b1        W1 [hidden, ACT_DIM, intermediate], b1 [ACT_DIM, intermediate]
    a = act(h)                   activation_type as in activation.py (gated: h[..., 0, :] activated)
    y = a @ W2 + b2              W2 [intermediate, out], b2 [out]

Two quantizer sets, one per GEMM, each as in dense: set 1 quantizes norm(x), W1
and dH (FC1's output gradient), set 2 quantizes a, W2 and dY; their updated
states come back as the quantizer_sets cotangent (a tuple of two sets). (The
reference's fused rule hands dY to set 1's dgrad quantizer; here each set
quantizes the gradient of its own GEMM's output, as two dense calls do, so the
fused and unfused Flax paths keep the same state in the same variables.)

Fusions under FP8 (FP8 tensors are written by the kernel that computes them):
the norm writes norm(x) in FP8 (layernorm_dense.quantized_norm); under delayed
scaling the activation kernel writes a in FP8, rowwise and transposed, from its
FP32 values, and the activation's backward kernel writes dH in FP8 the same way,
with db1 summed in the same pass. Current scaling needs a tensor's amax before
its scale, so there a and dH are computed in x's type and then cast.
h (FC1's output, x's type) is saved for the activation's backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax

from ._partition import active_mesh
from .activation import activation_attributes, activation_kind, canonicalize_activation_type
from .cpp_extensions import activation_bwd, activation_fwd
from .dense import _check_arguments, _dense_bwd, _dense_fwd, backward_gemms, fp8_forward
from .layernorm import check_norm_arguments, norm_backward
from .layernorm_dense import norm_then_gemm_forward
from .quantize import DelayedScaleQuantizer, QuantizerSet, noop_quantizer_set
from .quantize.quantizer import ScaledTensor


def layernorm_mlp(
    x,
    gamma,
    beta,
    kernels,
    biases,
    norm_type: str,
    zero_centered_gamma: bool = False,
    epsilon: float = 1e-6,
    norm_input_axes=None,
    dot_1_input_axes=None,
    dot_2_input_axes=None,
    kernel_1_axes=None,
    kernel_2_axes=None,
    ffn1_ckpt_name: str = "ffn1",
    ffn2_ckpt_name: str = "ffn2",
    activation_type=("gelu",),
    batch_first: bool = True,
    quantizer_sets=(noop_quantizer_set, noop_quantizer_set),
    activation_params=None,
):
    """The MLP block on x [..., hidden] -> [..., out] in x's type.

    kernels: [W1 [hidden, len(activation_type), intermediate], W2 [intermediate, out]];
    biases: [b1 [len(activation_type), intermediate] or None, b2 [out] or None]
    (cast to x's type, as dense does). gamma/beta/norm_type/zero_centered_gamma/
    epsilon as in layernorm.layernorm. quantizer_sets: (FC1's set, FC2's set),
    each noop_quantizer_set or QuantizerFactory.create_set(recipe); an FP8 GEMM
    needs multiples of 16 in its rows, inputs and outputs. activation_params:
    clamped_swiglu's {"limit", "alpha"}. norm_input_axes, kernel_1_axes and
    kernel_2_axes: logical axes of x, W1 and W2; with a mesh in scope the block
    partitions by them (FC1 column parallel, FC2 row parallel, sequence parallel
    norm, FSDP kernels; docs/te_jax.md). dot_1_input_axes / dot_2_input_axes (the
    layouts between follow from the kernels), ``*_ckpt_name`` (remat names; the custom
    VJP saves its own residuals) and batch_first are accepted.
    """
    norm_type = check_norm_arguments(norm_type, beta, zero_centered_gamma)
    names = canonicalize_activation_type(activation_type)
    kind = activation_kind(names)
    attrs = tuple(sorted(activation_attributes(kind, activation_params).items()))
    kernel_1, kernel_2, bias_1, bias_2, sets = _check_mlp_arguments(x, kernels, biases, quantizer_sets, len(names))
    mesh = active_mesh()
    if mesh is not None:
        from ._sharded_mlp import sharded_layernorm_mlp

        b1, b2 = (None if b is None else b.astype(x.dtype) for b in (bias_1, bias_2))
        return sharded_layernorm_mlp(
            mesh,
            x,
            gamma,
            beta,
            kernel_1.astype(x.dtype),
            kernel_2.astype(x.dtype),
            b1,
            b2,
            sets,
            (norm_type, zero_centered_gamma, float(epsilon)),
            (kind, attrs, len(names)),
            (norm_input_axes, kernel_1_axes, kernel_2_axes),
        )
    hidden = kernel_1.shape[0]
    x2 = x.reshape(-1, hidden)
    k1 = kernel_1.astype(x.dtype).reshape(hidden, -1)  # [hidden, ACT_DIM * intermediate]: [activated | linear]
    k2 = kernel_2.astype(x.dtype)
    b1 = None if bias_1 is None else bias_1.astype(x.dtype).reshape(-1)
    b2 = None if bias_2 is None else bias_2.astype(x.dtype)
    y = _layernorm_mlp(
        x2, gamma, beta, k1, k2, b1, b2, sets, norm_type, zero_centered_gamma, float(epsilon), kind, attrs
    )
    return y.reshape(*x.shape[:-1], kernel_2.shape[1])


def _check_mlp_arguments(x, kernels, biases, quantizer_sets, act_dim: int):
    """The kernels, biases and quantizer sets unpacked, or an error naming the argument."""
    for name, value in (("kernels", kernels), ("biases", biases), ("quantizer_sets", quantizer_sets)):
        if not isinstance(value, Sequence) or len(value) != 2:
            raise ValueError(f"argument '{name}' must be a sequence of two (FC1's, FC2's), got {value!r}")
    (kernel_1, kernel_2), (bias_1, bias_2) = kernels, biases
    if kernel_1.ndim != 3 or kernel_1.shape[1] != act_dim:
        raise ValueError(
            f"argument 'kernels[0]' must be [hidden, {act_dim}, intermediate] (ACT_DIM = len(activation_type)), "
            f"got shape {tuple(kernel_1.shape)}"
        )
    if kernel_2.ndim != 2 or kernel_2.shape[0] != kernel_1.shape[2]:
        raise ValueError(
            f"argument 'kernels[1]' must be [intermediate={kernel_1.shape[2]}, out], got shape {tuple(kernel_2.shape)}"
        )
    if bias_1 is not None and tuple(bias_1.shape) != tuple(kernel_1.shape[1:]):
        raise ValueError(f"argument 'biases[0]' must have shape {tuple(kernel_1.shape[1:])}, got {tuple(bias_1.shape)}")
    flat_1 = kernel_1.reshape(kernel_1.shape[0], -1)
    _check_arguments(x, flat_1, None if bias_1 is None else bias_1.reshape(-1), None, quantizer_sets[0])
    fc2_input = jax.ShapeDtypeStruct((*x.shape[:-1], kernel_2.shape[0]), x.dtype)
    _check_arguments(fc2_input, kernel_2, bias_2, None, quantizer_sets[1])
    return kernel_1, kernel_2, bias_1, bias_2, tuple(quantizer_sets)


def quantized_activation(h, kind, attrs, quantizer):
    """act(h) in FP8 (rowwise and columnwise) and the quantizer afterwards."""
    if isinstance(quantizer, DelayedScaleQuantizer):
        out = activation_fwd(h, kind, **_fp8_out(quantizer), rowwise=True, columnwise=True, **dict(attrs))
        return ScaledTensor(out.data, out.columnwise, out.scale_inv), quantizer.record(out.amax)
    return quantizer.quantize(activation_fwd(h, kind, **dict(attrs)), rowwise=True, columnwise=True)


def _fp8_out(quantizer) -> dict:
    """The FFI output keywords of a delayed quantizer: its type, scale and amax slot."""
    return {"out_dtype": quantizer.q_dtype, "scale": quantizer.scale, "amax": quantizer.amax_history[:1]}


@partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11, 12))
def _layernorm_mlp(x, gamma, beta, k1, k2, b1, b2, sets, norm_type, zero_centered_gamma, epsilon, kind, attrs):
    args = (x, gamma, beta, k1, k2, b1, b2, sets, norm_type, zero_centered_gamma, epsilon, kind, attrs)
    return _layernorm_mlp_fwd(*args)[0]


def _layernorm_mlp_fwd(x, gamma, beta, k1, k2, b1, b2, sets, norm_type, zero_centered_gamma, epsilon, kind, attrs):
    set_1, set_2 = sets
    h, norm_residuals, fc1_residuals = norm_then_gemm_forward(
        x, k1, gamma, beta, b1, set_1, norm_type, zero_centered_gamma, epsilon
    )
    if set_2.is_noop:
        y, fc2_residuals = _dense_fwd(activation_fwd(h, kind, **dict(attrs)), k2, b2, set_2)
    else:
        qa, a_quantizer = quantized_activation(h, kind, attrs, set_2.x)
        y, fc2_residuals = fp8_forward(qa, a_quantizer, k2, b2, set_2, x.dtype)
    return y, (norm_residuals, fc1_residuals, h, fc2_residuals)


def _layernorm_mlp_bwd(norm_type, zero_centered_gamma, epsilon, kind, attrs, residuals, dy):
    del epsilon  # the norm's backward reads rsigma
    (x, mu, rsigma, gamma), (ln_saved, k1_saved, b1, set_1), h, fc2_residuals = residuals
    da, dk2, db2, set_2 = _dense_bwd(fc2_residuals, dy)
    dh, db1, set_1 = _activation_backward(da, h, kind, attrs, b1, set_1)
    dln, dk1 = backward_gemms(dh, ln_saved, k1_saved, out_dtype=x.dtype)
    dx, dgamma, dbeta = norm_backward(dln, x, mu, rsigma, gamma, norm_type, zero_centered_gamma)
    return dx, dgamma, dbeta, dk1, dk2, db1, db2, (set_1, set_2)


def _activation_backward(da, h, kind, attrs, b1, set_1):
    """(dH: an array, or its FP8 ScaledTensor under set 1's dgrad quantizer; db1; set 1 afterwards)."""
    with_bias = {"dbias": b1 is not None, "dbias_dtype": h.dtype if b1 is None else b1.dtype}
    dgrad = set_1.dgrad
    if isinstance(dgrad, DelayedScaleQuantizer):
        out = activation_bwd(da, h, kind, **_fp8_out(dgrad), rowwise=True, columnwise=True, **with_bias, **dict(attrs))
        dh, dgrad = ScaledTensor(out.data, out.columnwise, out.scale_inv), dgrad.record(out.amax)
        db1 = out.dbias
    else:
        out = activation_bwd(da, h, kind, **with_bias, **dict(attrs))
        dh, db1 = (out.data, out.dbias) if b1 is not None else (out, None)
        if dgrad is not None:  # current scaling: the cast of the high-precision dH
            dh, dgrad = dgrad.quantize(dh, rowwise=True, columnwise=True)
    if dgrad is not None:
        set_1 = QuantizerSet(set_1.x, set_1.kernel, dgrad.update())
    return dh, db1, set_1


_layernorm_mlp.defvjp(_layernorm_mlp_fwd, _layernorm_mlp_bwd)
