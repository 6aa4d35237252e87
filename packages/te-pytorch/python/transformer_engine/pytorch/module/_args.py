"""Strict argument checks shared by the module constructors.

One rule per kind of argument, so that every module rejects the same bad
input with the same message (the argument's name and the rule): a size is an
int (not a bool, float or str) > 0, a flag is a bool (the string "False" is
not False), eps is a finite real number >= 0, and params_dtype is one of the
dtypes the kernels compute in. Checked at construction, so that a bad
argument never surfaces as an unrelated error at the first forward.
"""

from __future__ import annotations

import math
import numbers

import torch

PARAMS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_size(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be an int > 0, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{owner}: {name} must be an int > 0, got {value!r}")
    return int(value)


def check_bool(owner: str, name: str, value, allow_none: bool = False) -> None:
    if isinstance(value, bool) or (allow_none and value is None):
        return
    rule = "a bool or None" if allow_none else "a bool (True or False)"
    raise TypeError(f"{owner}: {name} must be {rule}, got {type(value).__name__} {value!r}")


def check_eps(owner: str, value, name: str = "eps") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a real number >= 0, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}: {name} must be a finite real number >= 0, got {value!r}")
    return float(value)


def check_params_dtype(owner: str, value, name: str = "params_dtype") -> torch.dtype:
    """The dtype to allocate parameters in (None: torch's default dtype)."""
    dtype = torch.get_default_dtype() if value is None else value
    if dtype not in PARAMS_DTYPES:
        allowed = ", ".join(str(d) for d in PARAMS_DTYPES)
        source = "" if value is not None else " (torch's default dtype; pass one explicitly)"
        raise TypeError(f"{owner}: {name} must be one of {allowed}, got {dtype!r}{source}")
    return dtype


def check_tensor(owner: str, name: str, value) -> None:
    """A forward's tensor argument: a torch.Tensor (not None, not a NumPy
    array -- torch.from_numpy(a) makes one without a copy)."""
    if isinstance(value, torch.Tensor):
        return
    hint = " (convert it with torch.from_numpy(...) or torch.as_tensor(...))" if hasattr(value, "__array__") else ""
    raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(value).__name__}{hint}")


_ABSENT = object()  # (the module has no such argument; None is a value to check)


def check_module_args(owner: str, sizes=None, flags=None, eps=_ABSENT, params_dtype=_ABSENT, dtype_name="params_dtype"):
    """Checks a constructor's arguments by kind; returns the resolved params
    dtype (None when the module has no params_dtype).

    sizes/flags: name -> value; eps, params_dtype: their values (left out:
    the module has none).
    """
    for name, value in (sizes or {}).items():
        check_size(owner, name, value)
    for name, value in (flags or {}).items():
        check_bool(owner, name, value)
    if eps is not _ABSENT:
        check_eps(owner, eps)
    if params_dtype is _ABSENT:
        return None
    return check_params_dtype(owner, params_dtype, dtype_name)
