"""Delayed-scaling state update (amax-history roll + scale), many tensors at once.

See core/include/te/recipe.h for the exact rule. Arrays are updated in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ._arrays import desc
from ._native import lib
from .dtypes import fp8_dtype as _fp8_dtype

_ALGOS = {"max": lib.AmaxComputeAlgo.MAX, "most_recent": lib.AmaxComputeAlgo.MOST_RECENT}


def _fp32_array(a, name: str) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise TypeError(f"argument '{name}' must be a C-contiguous float32 NumPy array (updated in place)")
    return a


def delayed_scaling_update(
    amax_histories: Sequence[np.ndarray],
    scales: Sequence[np.ndarray],
    scale_invs: Sequence[np.ndarray] | None = None,
    *,
    amax_reduction_buffer: np.ndarray | None = None,
    amax_compute_algo: str = "max",
    fp8_dtype="e4m3",
    margin: float = 0.0,
) -> None:
    """Roll each [L, n] amax history and recompute its scales, in place."""
    if amax_compute_algo not in _ALGOS:
        raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")
    histories = [_fp32_array(h, f"amax_histories[{i}]") for i, h in enumerate(amax_histories)]
    scale_list = [_fp32_array(s, f"scales[{i}]") for i, s in enumerate(scales)]
    invs = None if scale_invs is None else [_fp32_array(s, f"scale_invs[{i}]") for i, s in enumerate(scale_invs)]
    buffer = None
    if amax_reduction_buffer is not None:
        buffer = np.ascontiguousarray(amax_reduction_buffer, dtype=np.float32)
    lib.delayed_scaling_update(
        None if buffer is None else desc(buffer),
        [desc(h) for h in histories],
        [desc(s) for s in scale_list],
        None if invs is None else [desc(s) for s in invs],
        _ALGOS[amax_compute_algo],
        int(_fp8_dtype(fp8_dtype)),
        float(margin),
    )
