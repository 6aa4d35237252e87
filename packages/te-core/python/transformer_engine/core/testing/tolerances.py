"""Unit roundoffs (half an ulp at 1: the largest relative error of one
round-to-nearest) of the types the core reads and writes, from which the test
suites derive their error bounds.

`unit_roundoff` takes a NumPy or ml_dtypes dtype, a torch or JAX dtype, or a
name ("float32", "bfloat16", "float16", "e4m3", "e5m2")."""

from __future__ import annotations

import numpy as np

# By name; the FP8 formats by their te-core names (3 and 2 mantissa bits).
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11, "e4m3": 2.0**-4, "e5m2": 2.0**-3}
# Half the smallest subnormal: the largest absolute error of rounding a value
# below the smallest normal (gradual underflow).
HALF_SUBNORMAL = {"float32": 2.0**-150, "bfloat16": 2.0**-134, "float16": 2.0**-25}
SMALLEST_NORMAL = {"float32": 2.0**-126, "bfloat16": 2.0**-126, "float16": 2.0**-14}
FP8_NAMES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def dtype_name(dtype) -> str:
    """'float32', 'bfloat16', 'e4m3', ... for a dtype of NumPy, ml_dtypes, torch or JAX, or a name."""
    if isinstance(dtype, str):
        name = dtype
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype).removeprefix("torch.")
    else:
        name = np.dtype(dtype).name
    return FP8_NAMES.get(name, name)


def unit_roundoff(dtype) -> float:
    return UNIT_ROUNDOFF[dtype_name(dtype)]


def unit_roundoffs(*dtypes) -> dict:
    """{dtype: unit roundoff}, keyed by the dtypes given (a lookup table for a test module)."""
    return {d: unit_roundoff(d) for d in dtypes}


def half_subnormal(dtype) -> float:
    return HALF_SUBNORMAL[dtype_name(dtype)]


def smallest_subnormal(dtype) -> float:
    return 2 * HALF_SUBNORMAL[dtype_name(dtype)]


def smallest_normal(dtype) -> float:
    """2^-126 (FP32, BF16: the same exponent range) or 2^-14 (FP16)."""
    return SMALLEST_NORMAL[dtype_name(dtype)]
