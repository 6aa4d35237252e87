"""Strict argument checks of the NumPy-level API, shared by every function.

The rules (issue 15): a bool option takes only bool (or numpy.bool_), never a
string such as "False" that Python would call true; an int option takes only
an int (or a NumPy integer), never a float or a bool it would truncate; a real
number takes int or float (NumPy ones too), never a complex, a string or None;
a scalar FP32 argument (scale, scale_inv, amax) that an entry point needs may
not be None. Each error names the argument and the rule. Arrays keep their
rank (np.ascontiguousarray would turn a 0-d array into shape (1,)), arrays
updated in place must be writeable, and no array updated in place may share
memory with another argument of the same call.
"""

from __future__ import annotations

import numbers

import numpy as np

MAX_DIMS = 8  # TE_MAX_DIMS (te/types.h)


def _type_name(value) -> str:
    return type(value).__name__


def flag(value, name: str) -> bool:
    """A bool option: True/False or numpy.bool_ only."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"argument '{name}' must be a bool (True or False), got {_type_name(value)} {value!r}")


def integer(value, name: str, *, low: int | None = None, high: int | None = None) -> int:
    """An int option (a Python or NumPy integer, not a bool or a float), optionally in [low, high]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"argument '{name}' must be an int, got {_type_name(value)} {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (
            f"{low} to {high}"
            if low is not None and high is not None
            else (f">= {low}" if high is None else f"<= {high}")
        )
        raise ValueError(f"argument '{name}' must be an int in {bounds}, got {value}")
    return value


def real(value, name: str) -> float:
    """A real number option (int or float, NumPy ones too; not a bool, complex, string or None)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise TypeError(f"argument '{name}' must be a real number (int or float), got {_type_name(value)} {value!r}")
    return float(value)


def _numeric_array(value, name: str) -> np.ndarray:
    """value as an array of real numbers (bool, complex, strings and None refused)."""
    if value is None:
        raise TypeError(f"argument '{name}' is required (got None)")
    array = np.asarray(value)
    if array.dtype.kind in "cbOUSV":
        raise TypeError(f"argument '{name}' must hold real numbers, got dtype {array.dtype}")
    return array


def fp32_scalar(value, name: str) -> np.ndarray:
    """A required FP32 scalar (scale, scale_inv, amax): a fresh 0-d float32 array."""
    array = _numeric_array(value, name)
    if array.size != 1:
        raise ValueError(f"argument '{name}' must be a single number, got shape {array.shape}")
    return np.array(array, dtype=np.float32).reshape(())


def fp32_array(value, name: str) -> np.ndarray:
    """A C-contiguous float32 array of real numbers (a copy only when needed; rank kept)."""
    return contiguous(_numeric_array(value, name).astype(np.float32, copy=False), name)


def contiguous(value, name: str) -> np.ndarray:
    """value as a C-contiguous array of the same rank (0-d stays 0-d); None refused."""
    if value is None:
        raise TypeError(f"argument '{name}' is required (got None)")
    array = np.asarray(value, order="C")
    if array.ndim > MAX_DIMS:
        raise ValueError(f"argument '{name}' has {array.ndim} dims; the core takes at most {MAX_DIMS}")
    return array


def inplace_fp32(value, name: str) -> np.ndarray:
    """An FP32 array the call updates in place: C-contiguous and writeable."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float32 or not value.flags.c_contiguous:
        raise TypeError(f"argument '{name}' must be a C-contiguous float32 NumPy array (updated in place)")
    if not value.flags.writeable:
        raise ValueError(f"argument '{name}' is read-only (writeable=False) but is updated in place")
    return value


def disjoint(named: list[tuple[str, np.ndarray]], written: set[str]) -> None:
    """No array that the call writes may share memory with another argument."""
    for i, (name_a, a) in enumerate(named):
        for name_b, b in named[i + 1 :]:
            if (name_a in written or name_b in written) and np.shares_memory(a, b):
                raise ValueError(
                    f"arguments '{name_a}' and '{name_b}' share memory, but '{name_a if name_a in written else name_b}'"
                    " is written by this call: pass separate arrays"
                )


def choice(value, name: str, options) -> object:
    """One of a fixed set of values; the error lists them."""
    if isinstance(value, str) and value in options:
        return value
    names = [repr(o) for o in options]
    listed = " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)
    raise ValueError(f"argument '{name}' must be {listed}, got {value!r}")
