"""Block-scaled formats on JAX arrays through te-core (XLA FFI): MXFP8
quantization (te/mxfp8.h), FP8-block quantization (te/fp8_block.h) and the GEMM
on block-scaled operands (te/gemm_block.h).

MXFP8: FP8 data with one E8M0 scale (float8_e8m0fnu) per block of 32 elements
of the tensor viewed as [M, K]: rowwise blocks run along K (1x32), columnwise
blocks down the columns (32x1; the data keeps x's shape, it is not transposed).
Scales are in te-core's compact layout: rowwise [roundup(M, 128), roundup(K/32, 4)],
columnwise [roundup(M/32, 4), roundup(K, 128)], padding written as 0.

gemm_block: out = op(A) @ op(B) (+ bias[n]), each element of op(A) and op(B)
its dequantized value (te/gemm_block.h's table); MXFP8 takes any transa /
transb, the flag saying which copy an operand is (see te/gemm_block.h, Layouts).
"""

from __future__ import annotations

import math

import numpy as np

import jax
import jax.numpy as jnp
from transformer_engine.core.fp8_block import fp8_block_scale_shape
from transformer_engine.core.gemm_block import SCALING
from transformer_engine.core.mxfp8 import mxfp8_scale_shape
from transformer_engine.core.nvfp4 import scale_shape as nvfp4_scale_shape

from . import _registry  # noqa: F401 - registers the FFI targets
from ._checks import HIGH_PRECISION, check_dtype, check_fp8_dtype, dtype_name, gemm_epilogue

E8M0 = jnp.dtype(jnp.float8_e8m0fnu)
# te_scaling_mode codes (te/gemm_block.h) of the block formats, from te-core's table
SCALING_FP8_BLOCK_1D, SCALING_FP8_BLOCK_2D = SCALING["fp8_block_1d"], SCALING["fp8_block_2d"]
SCALING_MXFP8, SCALING_NVFP4 = SCALING["mxfp8"], SCALING["nvfp4"]
E4M3 = jnp.dtype(jnp.float8_e4m3fn)
_AMAX = jax.ShapeDtypeStruct((1,), jnp.float32)
_PLACEHOLDER = jax.ShapeDtypeStruct((0,), jnp.uint8)


def quantize_mxfp8(x, fp8_dtype=jnp.float8_e4m3fn, *, rowwise=True, columnwise=False, use_2d_blocks=False):
    """MXFP8 copies of x (FP32/BF16/FP16, rank >= 2, last dim % 32 == 0; columnwise and
    2-D blocks also need the leading dims' product % 32 == 0).

    Returns (rowwise | None, rowwise_scale_inv | None, columnwise | None,
    columnwise_scale_inv | None): data of x's shape in fp8_dtype, E8M0 scales.
    """
    check_dtype(x, "x", HIGH_PRECISION)
    fp8_dtype = check_fp8_dtype(fp8_dtype)
    if x.ndim < 2:
        raise ValueError(f"argument 'x' must have at least 2 dimensions for MXFP8, got shape {tuple(x.shape)}")
    m, k = math.prod(x.shape[:-1]), x.shape[-1]
    if k % 32:
        raise ValueError(f"argument 'x' must have a last dimension divisible by 32 for MXFP8, got {k}")
    if (columnwise or use_2d_blocks) and m % 32:
        raise ValueError(
            f"argument 'x' must have leading dims whose product is divisible by 32 for MXFP8 columnwise data "
            f"or 2-D blocks, got {m}"
        )
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    row_s, col_s = mxfp8_scale_shape(x.shape), mxfp8_scale_shape(x.shape, columnwise=True)
    data = jax.ShapeDtypeStruct(x.shape, fp8_dtype)
    results = (
        data if rowwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct(row_s, E8M0) if rowwise else _PLACEHOLDER,
        data if columnwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct(col_s, E8M0) if columnwise else _PLACEHOLDER,
    )
    call = jax.ffi.ffi_call("te_jax_quantize_mxfp8", results, vmap_method="sequential")
    row, row_si, col, col_si = call(x, use_2d_blocks=np.bool_(use_2d_blocks))
    keep = lambda t, asked: t if asked else None  # noqa: E731
    return keep(row, rowwise), keep(row_si, rowwise), keep(col, columnwise), keep(col_si, columnwise)


def quantize_fp8_block(
    x, fp8_dtype=jnp.float8_e4m3fn, *, rowwise=True, columnwise=False, block_2d=False, force_pow_2_scales=True,
    amax_epsilon=0.0,
):  # fmt: skip
    """FP8-block copies of x viewed as [M, K] (FP32/BF16/FP16, K % 16 == 0): one FP32
    scale per 1x128 block (columnwise: 128x1), or per 128x128 tile with block_2d; the
    scale of a block is te/fp8_block.h's (fp8_max / max(amax, amax_epsilon), a power of
    2 with force_pow_2_scales). GEMM-ready layout: the columnwise copy is transposed
    ([K, M]), the scales padded. Returns (rowwise | None, rowwise_scale_inv | None,
    columnwise | None, columnwise_scale_inv | None)."""
    check_dtype(x, "x", HIGH_PRECISION)
    fp8_dtype = check_fp8_dtype(fp8_dtype)
    if x.ndim < 1 or x.shape[-1] % 16:
        raise ValueError(f"argument 'x' must have a last dimension divisible by 16 for FP8 blocks, got {x.shape}")
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    if not np.isfinite(amax_epsilon) or amax_epsilon < 0:
        raise ValueError(f"argument 'amax_epsilon' must be finite and >= 0, got {amax_epsilon}")
    m, k = math.prod(x.shape[:-1]), x.shape[-1]
    # (te-core asks the core itself: te_fp8_block_scale_shape, GEMM-ready layout)
    block_dim = 2 if block_2d else 1
    row_s = fp8_block_scale_shape(x.shape, block_dim=block_dim)
    col_s = fp8_block_scale_shape(x.shape, block_dim=block_dim, columnwise=True)
    results = (
        jax.ShapeDtypeStruct((m, k), fp8_dtype) if rowwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct(row_s, jnp.float32) if rowwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct((k, m), fp8_dtype) if columnwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct(col_s, jnp.float32) if columnwise else _PLACEHOLDER,
    )
    call = jax.ffi.ffi_call("te_jax_quantize_fp8_block", results, vmap_method="sequential")
    row, row_si, col, col_si = call(
        x.reshape(m, k),
        block_dim=np.int32(block_dim),
        force_pow2_scales=np.bool_(force_pow_2_scales),
        amax_epsilon=np.float32(amax_epsilon),
    )
    keep = lambda t, asked: t if asked else None  # noqa: E731
    return keep(row, rowwise), keep(row_si, rowwise), keep(col, columnwise), keep(col_si, columnwise)


def nvfp4_amax(x, *, random_hadamard=False, rht_sign_mask=0):
    """(amax_rowwise, amax_columnwise), float32 (1,) each, of x viewed as [M, K]
    (te_nvfp4_compute_amax): max |x|, and max |RHT(x)| with random_hadamard (then
    M % 16 == 0)."""
    check_dtype(x, "x", HIGH_PRECISION)
    call = jax.ffi.ffi_call("te_jax_nvfp4_amax", (_AMAX, _AMAX), vmap_method="sequential")
    return call(
        x.reshape(-1, x.shape[-1]), random_hadamard=np.bool_(random_hadamard), rht_sign_mask=np.int32(rht_sign_mask)
    )


def quantize_nvfp4(
    x, amax_rowwise=None, amax_columnwise=None, rng_state=None, *, rowwise=True, columnwise=False, block_2d=False,
    stochastic_rounding=False, random_hadamard=False, rht_sign_mask=0,
):  # fmt: skip
    """NVFP4 copies of x viewed as [M, K] (te/nvfp4.h; K % 16 == 0, and M % 16 == 0 for
    the columnwise copy): E2M1 data packed two per byte (rowwise uint8 [M, K/2],
    columnwise uint8 [K, M/2], the transpose), E4M3 scales per 16 elements (16x16 tiles
    with block_2d), scaled by the given global amaxes (float32 (1,), one per asked
    direction: nvfp4_amax's, max-reduced over a mesh by the caller). Stochastic
    rounding draws from rng_state, uint32 (4,): the (seed, offset) int64 pair's words.
    The RHT applies to the columnwise copy. Returns (rowwise | None, rowwise_scale |
    None, columnwise | None, columnwise_scale | None)."""
    check_dtype(x, "x", HIGH_PRECISION)
    if x.ndim < 1 or x.shape[-1] % 16:
        raise ValueError(f"argument 'x' must have a last dimension divisible by 16 for NVFP4, got {x.shape}")
    m, k = math.prod(x.shape[:-1]), x.shape[-1]
    if (columnwise or block_2d) and m % 16:
        raise ValueError(
            f"argument 'x' must have leading dims whose product is divisible by 16 (columnwise / 2-D), got {m}"
        )
    if not (rowwise or columnwise):
        raise ValueError("at least one of 'rowwise' and 'columnwise' must be True")
    for name, amax, asked in (
        ("amax_rowwise", amax_rowwise, rowwise),
        ("amax_columnwise", amax_columnwise, columnwise),
    ):
        if asked and (amax is None or amax.shape != (1,) or jnp.dtype(amax.dtype) != jnp.float32):
            raise ValueError(f"argument '{name}' must be a float32 array of shape (1,) for the asked direction")
    if stochastic_rounding and (
        rng_state is None or rng_state.shape != (4,) or jnp.dtype(rng_state.dtype) != jnp.uint32
    ):
        raise ValueError("argument 'rng_state' must be uint32 of shape (4,) with stochastic_rounding")
    if stochastic_rounding:  # (as int32 words: te-core's INT32 descriptor, re-read as INT64 [2] by the handler)
        rng_state = jax.lax.bitcast_convert_type(rng_state, jnp.int32)
    none = jnp.zeros((0,), jnp.float32)
    results = (
        jax.ShapeDtypeStruct((m, k // 2), jnp.uint8) if rowwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct(nvfp4_scale_shape(m, k), E4M3) if rowwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct((k, m // 2), jnp.uint8) if columnwise else _PLACEHOLDER,
        jax.ShapeDtypeStruct(nvfp4_scale_shape(k, m), E4M3) if columnwise else _PLACEHOLDER,
    )
    call = jax.ffi.ffi_call("te_jax_nvfp4_quantize", results, vmap_method="sequential")
    row, row_s, col, col_s = call(
        x.reshape(m, k),
        amax_rowwise if rowwise else none,
        amax_columnwise if columnwise else none,
        rng_state if stochastic_rounding else jnp.zeros((0,), jnp.int32),
        block_2d=np.bool_(block_2d),
        stochastic_rounding=np.bool_(stochastic_rounding),
        random_hadamard=np.bool_(random_hadamard),
        rht_sign_mask=np.int32(rht_sign_mask),
    )
    keep = lambda t, asked: t if asked else None  # noqa: E731
    return keep(row, rowwise), keep(row_s, rowwise), keep(col, columnwise), keep(col_s, columnwise)


_SCALE_DTYPE = {
    SCALING_FP8_BLOCK_1D: jnp.dtype(jnp.float32),
    SCALING_FP8_BLOCK_2D: jnp.dtype(jnp.float32),
    SCALING_NVFP4: E4M3,
}


def gemm_block(
    a, a_scale_inv, b, b_scale_inv, *, a_scaling=SCALING_MXFP8, b_scaling=SCALING_MXFP8, transa=False, transb=False,
    out_dtype=jnp.bfloat16, bias=None, a_amax=None, b_amax=None,
):  # fmt: skip
    """op(A) @ op(B) (+ bias) on block-scaled operands: A and B FP8 arrays with their
    scales and te_scaling_mode codes (MXFP8: E8M0 scales, any transa / transb; FP8
    block 1-D / 2-D: FP32 scales, transa = 0 and transb = 1; see te/gemm_block.h for
    which copy each takes; NVFP4: packed uint8 data, E4M3 scales and the copy's global
    amax, TN). Returns out [M, N] in out_dtype (float32, bfloat16 or float16)."""
    for name, data, scale, scaling in (("a", a, a_scale_inv, a_scaling), ("b", b, b_scale_inv, b_scaling)):
        if scaling != SCALING_NVFP4:
            check_fp8_dtype(data.dtype)
        elif jnp.dtype(data.dtype) != jnp.uint8:
            raise TypeError(f"argument '{name}' must be packed NVFP4 bytes (uint8), got {dtype_name(data.dtype)}")
        want = _SCALE_DTYPE.get(scaling, E8M0)
        if jnp.dtype(scale.dtype) != want:
            raise TypeError(f"argument '{name}_scale_inv' must be {want.name}, got {dtype_name(scale.dtype)}")
        if data.ndim != 2:
            raise ValueError(f"argument '{name}' must be 2-D [rows, cols], got shape {tuple(data.shape)}")
    a_shape = (a.shape[0], 2 * a.shape[1]) if a_scaling == SCALING_NVFP4 else a.shape  # (two E2M1 per byte)
    b_shape = (b.shape[0], 2 * b.shape[1]) if b_scaling == SCALING_NVFP4 else b.shape
    m, k = (a_shape[1], a_shape[0]) if transa else a_shape
    k_b, n = (b_shape[1], b_shape[0]) if transb else b_shape
    if k != k_b:
        raise ValueError(f"inner dimensions differ: op(a) is [{m}, {k}] but op(b) is [{k_b}, {n}]")
    out_dtype, bias = gemm_epilogue(out_dtype, bias, n)
    none = jnp.zeros((0,), jnp.float32)  # (no global amax: NVFP4 only)
    call = jax.ffi.ffi_call("te_jax_gemm_block", jax.ShapeDtypeStruct((m, n), out_dtype), vmap_method="sequential")
    return call(
        a,
        a_scale_inv,
        none if a_amax is None else a_amax,
        b,
        b_scale_inv,
        none if b_amax is None else b_amax,
        bias,
        a_scaling=np.int32(a_scaling),
        b_scaling=np.int32(b_scaling),
        transa=np.bool_(transa),
        transb=np.bool_(transb),
    )
