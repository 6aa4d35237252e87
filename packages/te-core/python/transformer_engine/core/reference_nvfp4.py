"""NumPy + ml_dtypes oracle of NVFP4 quantization, independent of the native code.

Written from the formulas in docs/numerics.md ("NVFP4"): whole-array NumPy
operations in FP32 (float64 only where a comparison must be exact), ml_dtypes
for the E4M3 and E2M1 roundings, and Philox4x32-10 in NumPy uint32/uint64
arithmetic for stochastic rounding.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
BLOCK = 16
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_NAN_CODE = 0x7  # NaN -> +6

PHILOX_M = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
PHILOX_W = (np.uint32(0x9E3779B9), np.uint32(0xBB67AE85))
LOW32 = np.uint64(0xFFFFFFFF)


# ----------------------------------------------------------------- Philox
def philox4x32_10(counter, key):
    """Philox4x32-10 of counters (4 uint32 arrays) with keys (2 uint32 arrays)."""
    c = [np.asarray(v, np.uint32) for v in counter]
    k = [np.asarray(v, np.uint32) for v in key]
    with np.errstate(over="ignore"):
        for r in range(10):
            if r:
                k = [k[0] + PHILOX_W[0], k[1] + PHILOX_W[1]]
            p0 = PHILOX_M[0] * c[0].astype(np.uint64)
            p1 = PHILOX_M[1] * c[2].astype(np.uint64)
            hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & LOW32).astype(np.uint32)
            hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & LOW32).astype(np.uint32)
            c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
    return c


def random_words(seed: int, offset: int, index) -> np.ndarray:
    """Word `index` of the stream (seed, offset): word w % 4 of Philox with
    counter (lo, hi of index // 4, lo, hi of offset) and key (lo, hi of seed)."""
    index = np.asarray(index, np.uint64)
    n = index >> np.uint64(2)
    split = lambda v: (np.uint32(int(v) & 0xFFFFFFFF), np.uint32(int(v) >> 32))
    off_lo, off_hi = split(offset)
    seed_lo, seed_hi = split(seed)
    words = philox4x32_10(
        [
            (n & LOW32).astype(np.uint32),
            (n >> np.uint64(32)).astype(np.uint32),
            np.full(n.shape, off_lo),
            np.full(n.shape, off_hi),
        ],
        [np.full(n.shape, seed_lo), np.full(n.shape, seed_hi)],
    )
    lane = (index & np.uint64(3)).astype(np.int64)
    return np.choose(lane, words).astype(np.uint32)


# ------------------------------------------------------------- Hadamard
def hadamard_matrix(sign_mask: int) -> np.ndarray:
    """H = (1/4) diag(S) H16 in float64 (H16 Sylvester, S_i = -1 where bit i set)."""
    i = np.arange(BLOCK)
    popcount = np.vectorize(lambda v: int(v).bit_count())(i[:, None] & i[None, :])
    h16 = np.where(popcount % 2 == 0, 1.0, -1.0)
    signs = np.where((sign_mask >> i) & 1, -1.0, 1.0)
    return 0.25 * signs[:, None] * h16


def hadamard_fp32(v: np.ndarray, sign_mask: int) -> np.ndarray:
    """v[..., 16] @ H in FP32 in the documented order: sign flips, butterflies
    h = 1, 2, 4, 8 ((a, b) -> (a + b, a - b)), then * 0.25."""
    signs = ((sign_mask >> np.arange(BLOCK)) & 1).astype(bool)
    y = np.where(signs, -v, v).astype(np.float32)
    lead = y.shape[:-1]
    with np.errstate(invalid="ignore", over="ignore"):
        for h in (1, 2, 4, 8):
            pairs = y.reshape(lead + (BLOCK // (2 * h), 2, h))
            a, b = pairs[..., 0, :], pairs[..., 1, :]
            y = np.stack([a + b, a - b], axis=-2).reshape(lead + (BLOCK,))
        return (y * F32(0.25)).astype(np.float32)


# ---------------------------------------------------------------- scales
def global_encode_scale(amax) -> np.float32:
    """S_enc = fmin(2688 / amax, FLT_MAX); 1 when amax == 0 or S_enc == 0."""
    amax = F32(amax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.fmin(F32(448.0 * 6.0) / amax, FLT_MAX)
    return F32(1.0) if (amax == 0 or s == 0) else F32(s)


def to_e4m3_bytes(v: np.ndarray) -> np.ndarray:
    """Saturating nearest-even cast of non-negative non-NaN FP32 values."""
    return np.clip(v, -448.0, 448.0).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def block_scales(block_amax: np.ndarray, s_enc) -> np.ndarray:
    """E4M3 bytes of block_amax * (S_enc * (1/6)), clamped to FLT_MAX first."""
    rcp6 = F32(1.0) / F32(6.0)
    with np.errstate(over="ignore"):
        v = np.asarray(block_amax, np.float32) * F32(F32(s_enc) * rcp6)
    return to_e4m3_bytes(np.fmin(v, FLT_MAX))


def decode_factors(scale_bytes: np.ndarray, s_dec) -> np.ndarray:
    """float(s_b) * S_dec."""
    return scale_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * F32(s_dec)


def encode_factors(scale_bytes: np.ndarray, s_dec) -> np.ndarray:
    """min(1 / (float(s_b) * S_dec), FLT_MAX)."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.fmin(F32(1.0) / decode_factors(scale_bytes, s_dec), FLT_MAX)


# ---------------------------------------------------------------- E2M1
def e2m1_nearest(v: np.ndarray) -> np.ndarray:
    """E2M1 codes of FP32 values, nearest even, saturating; NaN -> 0x7."""
    v = np.asarray(v, np.float32)
    codes = np.clip(v, -6.0, 6.0).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return np.where(np.isnan(v), E2M1_NAN_CODE, codes).astype(np.uint8)


def e2m1_stochastic(v: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Stochastic E2M1 codes: |v| between grid points lo < hi goes to hi when
    r < (|v| - lo) / (hi - lo) * 2^32, exactly; |v| >= 6 -> 6; NaN -> 0x7."""
    v = np.asarray(v, np.float32)
    a = np.abs(v)
    finite_below = a < 6.0  # excludes NaN and values to saturate
    safe = np.where(finite_below, a, np.float32(0.0))
    lo_code = np.searchsorted(E2M1_GRID, safe, side="right") - 1
    lo = E2M1_GRID[lo_code]
    hi = E2M1_GRID[np.minimum(lo_code + 1, 7)]
    frac = ((safe - lo) / (hi - lo)).astype(np.float32)
    up = r.astype(np.float64) < frac.astype(np.float64) * 2.0**32
    magnitude = np.where(finite_below, lo_code + up, 7)
    codes = magnitude | np.where(np.signbit(v), 0x8, 0)
    return np.where(np.isnan(v), E2M1_NAN_CODE, codes).astype(np.uint8)


def e2m1_values(codes: np.ndarray) -> np.ndarray:
    magnitude = E2M1_GRID[codes & 0x7]
    return np.where(codes & 0x8, -magnitude, magnitude).astype(np.float32)


def pack(codes: np.ndarray) -> np.ndarray:
    """[..., 2n] codes -> [..., n] bytes, element 2i in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray) -> np.ndarray:
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (-1,))


# ------------------------------------------------------------ quantize
def scale_shape(rows: int, cols: int) -> tuple[int, int]:
    return (-(-rows // 128) * 128, -(-(cols // BLOCK) // 4) * 4)


def abs_max_ignore_nan(a: np.ndarray, axis) -> np.ndarray:
    return np.fmax.reduce(np.abs(a), axis=axis, initial=np.float32(0.0)).astype(np.float32)


def amax(x: np.ndarray) -> np.float32:
    """max |x| with NaN skipped (0 for all-NaN)."""
    return F32(abs_max_ignore_nan(np.asarray(x, np.float32).ravel(), axis=0))


def columnwise_values(x2d: np.ndarray, rht: bool, sign_mask: int) -> np.ndarray:
    """[K, M] FP32 values the columnwise copy quantizes (RHT along M)."""
    t = np.ascontiguousarray(x2d.T)
    if not rht:
        return t
    k, m = t.shape
    return hadamard_fp32(t.reshape(k, m // BLOCK, BLOCK), sign_mask).reshape(k, m)


def quantize_matrix(values, block_amax, global_amax, words=None):
    """Quantize values [R, C] with per-block amaxes [R, C/16] (words: [R, C]
    uint32 for stochastic rounding). Returns (packed [R, C/2], scales [R, C/16])."""
    s_enc = global_encode_scale(global_amax)
    s_dec = F32(1.0) / s_enc
    scales = block_scales(block_amax, s_enc)
    enc = np.repeat(encode_factors(scales, s_dec), BLOCK, axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = (values * enc).astype(np.float32)
    codes = e2m1_nearest(scaled) if words is None else e2m1_stochastic(scaled, words)
    return pack(codes), scales


def padded(scales: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros(scale_shape(rows, cols), np.uint8)
    out[: scales.shape[0], : scales.shape[1]] = scales
    return out


def quantize(
    x,
    amax_rowwise=None,
    amax_columnwise=None,
    *,
    rowwise=True,
    columnwise=False,
    block_2d=False,
    stochastic_rounding=False,
    seed=0,
    offset=0,
    random_hadamard=False,
    rht_sign_mask=0,
):
    """Dict with 'rowwise', 'rowwise_scale', 'columnwise', 'columnwise_scale'
    (uint8 arrays, scales padded with 0) and the amaxes used."""
    x2d = np.asarray(x, np.float32).reshape(-1, np.shape(x)[-1])
    m, k = x2d.shape
    col_values = columnwise_values(x2d, random_hadamard, rht_sign_mask) if columnwise else None
    if amax_rowwise is None:
        amax_rowwise = amax(x2d)
    if amax_columnwise is None:
        amax_columnwise = amax(col_values) if columnwise else amax(x2d)
    element = np.arange(m * k, dtype=np.uint64).reshape(m, k)
    out = {"amax_rowwise": F32(amax_rowwise), "amax_columnwise": F32(amax_columnwise)}
    if block_2d:
        tiles = abs_max_ignore_nan(x2d.reshape(m // BLOCK, BLOCK, k // BLOCK, BLOCK), axis=(1, 3))
    if rowwise:
        block_amax = (
            np.repeat(tiles, BLOCK, axis=0)
            if block_2d
            else abs_max_ignore_nan(x2d.reshape(m, k // BLOCK, BLOCK), axis=2)
        )
        words = random_words(seed, offset, element) if stochastic_rounding else None
        data, scales = quantize_matrix(x2d, block_amax, amax_rowwise, words)
        out["rowwise"] = data.reshape(np.shape(x)[:-1] + (k // 2,))
        out["rowwise_scale"] = padded(scales, m, k)
    if columnwise:
        block_amax = (
            np.repeat(tiles.T, BLOCK, axis=0)
            if block_2d
            else abs_max_ignore_nan(col_values.reshape(k, m // BLOCK, BLOCK), axis=2)
        )
        index = element.T if block_2d else np.uint64(m * k) + element.reshape(k, m)
        words = random_words(seed, offset, index) if stochastic_rounding else None
        data, scales = quantize_matrix(col_values, block_amax, amax_columnwise, words)
        out["columnwise"] = data
        out["columnwise_scale"] = padded(scales, k, m)
    return out


def dequantize(packed, scale_bytes, global_amax, out_dtype=np.float32) -> np.ndarray:
    """float(q) * (float(s_b) * S_dec), rounded to out_dtype."""
    codes = unpack(np.asarray(packed, np.uint8))
    shape = codes.shape
    rows, cols = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    s_dec = F32(1.0) / global_encode_scale(global_amax)
    factors = decode_factors(np.asarray(scale_bytes).view(np.uint8)[:rows, : cols // BLOCK], s_dec)
    with np.errstate(over="ignore", invalid="ignore"):
        values = e2m1_values(codes.reshape(rows, cols)) * np.repeat(factors, BLOCK, axis=1)
        return values.astype(np.float32).astype(out_dtype).reshape(shape)
