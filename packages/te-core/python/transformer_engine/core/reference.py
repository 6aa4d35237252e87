"""NumPy + ml_dtypes oracle of the core's numerics, independent of the native code.

Every test suite checks the core (CPU and CUDA backends) against these
functions. They are written from the formulas in docs/numerics.md with NumPy
and ml_dtypes conversions, not from the C++ sources.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FP8_NUMPY = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
CANONICAL_NAN_BYTE = 0x7F
FLT_MAX = np.finfo(np.float32).max


def cast_to_fp8_bytes(values_fp32: np.ndarray, fmt: str) -> np.ndarray:
    """Saturating round-to-nearest-even cast of FP32 values; NaN -> 0x7F."""
    v = np.asarray(values_fp32, dtype=np.float32)
    clipped = np.clip(v, -FP8_MAX[fmt], FP8_MAX[fmt])  # +-inf saturate, NaN passes through
    out = clipped.astype(FP8_NUMPY[fmt]).view(np.uint8).copy()
    out[np.isnan(v)] = CANONICAL_NAN_BYTE
    return out


def quantize_fp8(x: np.ndarray, scale: float, fmt: str) -> np.ndarray:
    """q = saturate(RNE(float32(x) * scale)) as bytes, same shape as x."""
    product = np.asarray(x).astype(np.float32) * np.float32(scale)
    return cast_to_fp8_bytes(product, fmt)


def columnwise(q: np.ndarray) -> np.ndarray:
    """The [K, M] transpose of q viewed as [M, K]."""
    k = q.shape[-1] if q.ndim else 1
    return np.ascontiguousarray(q.reshape(-1, k).T)


def amax(x: np.ndarray) -> np.float32:
    """max |x| ignoring NaN; 0 for empty or all-NaN input."""
    a = np.abs(np.asarray(x).astype(np.float32)).ravel()
    a = a[~np.isnan(a)]
    return np.float32(a.max()) if a.size else np.float32(0.0)


def scale_from_amax(amax_value, fmt: str, force_pow2=False, epsilon=0.0, value_for_inf=FLT_MAX):
    """The reference library's compute_scale_from_amax, in float32."""
    a = np.float32(amax_value)
    if a < np.float32(epsilon):
        a = np.float32(epsilon)
    if a == 0 or not np.isfinite(a):
        return np.float32(1.0)
    with np.errstate(over="ignore", divide="ignore"):
        scale = np.float32(FP8_MAX[fmt]) / a
    if np.isinf(scale):
        scale = np.float32(value_for_inf)
    if force_pow2:
        mantissa, exponent = np.frexp(scale)  # scale = m * 2^e, m in [0.5, 1)
        scale = np.float32(np.ldexp(np.float32(1.0), int(exponent) - 1))
    return np.float32(scale)


def dequantize_fp8(q_bytes: np.ndarray, scale_inv: float, fmt: str, out_dtype=np.float32) -> np.ndarray:
    values = q_bytes.view(FP8_NUMPY[fmt]).astype(np.float32) * np.float32(scale_inv)
    with np.errstate(over="ignore"):  # E5M2 values above the FP16 max become inf, as in C
        return values.astype(out_dtype)


def delayed_scaling_update(history: np.ndarray, scale: np.ndarray, fmt: str, margin=0.0, algo="max", reduced_amax=None):
    """One group's update; returns (new_history, new_scale) without touching inputs.

    Written as the reference library's unfused path: np.roll by -1, newest amax
    in the last slot, slot 0 zeroed, no roll where the newest amax is 0.
    """
    history = history.astype(np.float32).copy()
    scale = scale.astype(np.float32).copy()
    last = history[0].copy()
    if reduced_amax is not None:
        reduced = np.asarray(reduced_amax, np.float32)
        last = np.where(reduced != 0, reduced, last)
    rolled = np.roll(history, -1, axis=0)
    rolled[-1] = last
    window = np.fmax.reduce(rolled, axis=0)
    rolled[0] = 0
    active = last != 0
    history[:, active] = rolled[:, active]
    amax_used = last if algo == "most_recent" else np.where(active, window, 0).astype(np.float32)
    scaled_max = np.float32(FP8_MAX[fmt]) * np.float32(2.0 ** (-margin))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        candidate = scaled_max / amax_used
    good = np.isfinite(amax_used) & (amax_used > 0)
    new_scale = np.where(good, candidate, scale).astype(np.float32)
    new_scale[np.isinf(new_scale)] = FLT_MAX
    return history, new_scale
