"""Deprecated spellings kept for one release."""

from __future__ import annotations

import functools
import warnings


def renamed_keyword(old: str, new: str):
    """Lets a function take keyword `old` as a deprecated spelling of `new`."""

    def wrap(fn):
        @functools.wraps(fn)
        def accepting_old(*args, **kwargs):
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{fn.__name__}() got both {new!r} and its deprecated spelling {old!r}")
                message = f"{fn.__name__}(): keyword {old!r} is deprecated, use {new!r}"
                warnings.warn(message, DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return accepting_old

    return wrap
