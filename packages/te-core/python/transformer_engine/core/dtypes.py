"""Element types of the core and their NumPy (ml_dtypes) counterparts.

The integer codes are the C API's te_dtype (they follow the reference library's
NVTEDType numbering).
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.IntEnum):
    """te_dtype codes; member names follow the reference library's `DType`."""

    kByte = 0
    kInt16 = 1
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    kFloat4E2M1 = 10


_NUMPY_TO_TE = {
    np.dtype(np.uint8): DType.kByte,
    np.dtype(np.int16): DType.kInt16,
    np.dtype(np.int32): DType.kInt32,
    np.dtype(np.int64): DType.kInt64,
    np.dtype(np.float32): DType.kFloat32,
    np.dtype(np.float16): DType.kFloat16,
    np.dtype(ml_dtypes.bfloat16): DType.kBFloat16,
    np.dtype(ml_dtypes.float8_e4m3fn): DType.kFloat8E4M3,
    np.dtype(ml_dtypes.float8_e5m2): DType.kFloat8E5M2,
    np.dtype(ml_dtypes.float8_e8m0fnu): DType.kFloat8E8M0,
}
_TE_TO_NUMPY = {v: k for k, v in _NUMPY_TO_TE.items()}

FP8_DTYPES = (DType.kFloat8E4M3, DType.kFloat8E5M2)
FP8_MAX = {DType.kFloat8E4M3: 448.0, DType.kFloat8E5M2: 57344.0}


def te_dtype(dtype) -> DType:
    """The te_dtype of a NumPy dtype, a DType, or a name like 'e4m3'/'e5m2'."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        short = {"e4m3": DType.kFloat8E4M3, "e5m2": DType.kFloat8E5M2}
        if dtype.lower() in short:
            return short[dtype.lower()]
    try:
        return _NUMPY_TO_TE[np.dtype(dtype)]
    except (KeyError, TypeError):
        names = ", ".join(str(d) for d in _NUMPY_TO_TE)
        raise TypeError(
            f"argument 'dtype' has no core dtype: {dtype!r}; expected 'e4m3', 'e5m2', a DType or one of {names}"
        ) from None


def numpy_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype that holds elements of a te_dtype."""
    if isinstance(dtype, (bool, np.bool_)) or not isinstance(dtype, (int, np.integer)):
        raise TypeError(f"argument 'dtype' must be a DType (an int code), got {type(dtype).__name__} {dtype!r}")
    try:
        return _TE_TO_NUMPY[DType(int(dtype))]
    except ValueError:
        raise ValueError(f"argument 'dtype' must be a DType code 0 to {max(DType)}, got {int(dtype)}") from None
    except KeyError:
        held = ", ".join(d.name for d in _TE_TO_NUMPY)
        raise ValueError(
            f"argument 'dtype' {DType(int(dtype)).name} has no NumPy element type (packed FP4 travels as uint8 "
            f"bytes); the ones that have: {held}"
        ) from None


def fp8_dtype(dtype) -> DType:
    """te_dtype of an FP8 format, raising TypeError for anything else."""
    try:
        code = te_dtype(dtype)
    except TypeError:
        code = None
    if code not in FP8_DTYPES:
        raise TypeError(f"argument fp8_dtype must be float8_e4m3fn or float8_e5m2 ('e4m3' or 'e5m2'), got {dtype!r}")
    return code
