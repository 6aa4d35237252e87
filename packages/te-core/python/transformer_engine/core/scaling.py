"""Delayed-scaling state update (amax-history roll + scale), many tensors at once.

See core/include/te/recipe.h for the exact rule (the reference library's).
Arrays are updated in place. The rule is kept as it is, but a suspect amax is
reported: a scale update driven by a non-finite amax (the scale is then kept)
or by one above SUSPECT_AMAX (the scale then collapses, and every value below
amax / fp8_max of the following steps quantizes to zero, until the amax leaves
the history window) warns with AmaxWarning, and the returned ScalingUpdate
lists the (tensor, column) pairs concerned so the caller can act on them
(skip the step, reset the history) without parsing warnings.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ._arrays import desc
from ._checks import choice, disjoint, fp32_array, inplace_fp32, real
from ._native import lib
from .dtypes import fp8_dtype as _fp8_dtype

_ALGOS = {"max": lib.AmaxComputeAlgo.MAX, "most_recent": lib.AmaxComputeAlgo.MOST_RECENT}
# 2^64: far beyond any FP8-trained tensor (BF16/FP16 training overflows long before),
# and the scale of such an amax flushes every value below 2^55 (E4M3) to zero.
SUSPECT_AMAX = 2.0**64


class AmaxWarning(RuntimeWarning):
    """A delayed-scaling update was driven by a non-finite or absurdly large amax."""


class ScalingUpdate(NamedTuple):
    """What delayed_scaling_update saw: the (tensor index, column) pairs whose
    scale update was driven by a non-finite amax or one above SUSPECT_AMAX."""

    suspect: tuple[tuple[int, int], ...]

    @property
    def ok(self) -> bool:
        return not self.suspect


def _driving_amax(history: np.ndarray, last: np.ndarray, algo: str) -> np.ndarray:
    """The amax each column's scale update uses (recipe.h), before the roll; 0 = no update."""
    window = last if algo == "most_recent" or history.shape[0] == 1 else np.maximum(history[1:].max(axis=0), last)
    return np.where(last != 0, window, 0.0)


def _suspects(histories, buffer, algo: str) -> tuple[tuple[int, int], ...]:
    found, offset = [], 0
    for k, h in enumerate(histories):
        h64 = h.astype(np.float64).reshape(h.shape[0], -1)
        last = h64[0]
        if buffer is not None:
            reduced = buffer[offset : offset + last.size].astype(np.float64)
            last = np.where(reduced != 0, reduced, last)
        offset += last.size
        amax = _driving_amax(h64, last, algo)
        bad = ~np.isfinite(amax) | (np.abs(amax) > SUSPECT_AMAX)
        found += [(k, int(j)) for j in np.flatnonzero(bad)]
    return tuple(found)


def _state(amax_histories, scales, scale_invs, amax_reduction_buffer):
    """The validated arrays: writeable float32 state, no two overlapping."""
    named = [(f"amax_histories[{i}]", inplace_fp32(h, f"amax_histories[{i}]")) for i, h in enumerate(amax_histories)]
    named += [(f"scales[{i}]", inplace_fp32(s, f"scales[{i}]")) for i, s in enumerate(scales)]
    if scale_invs is not None:
        named += [(f"scale_invs[{i}]", inplace_fp32(s, f"scale_invs[{i}]")) for i, s in enumerate(scale_invs)]
    buffer = None
    if amax_reduction_buffer is not None:
        buffer = fp32_array(amax_reduction_buffer, "amax_reduction_buffer")
        named.append(("amax_reduction_buffer", buffer))
    # Every state array is rolled or rewritten in place, so none may overlap another.
    disjoint(named, written={name for name, _ in named if name != "amax_reduction_buffer"})

    def group(prefix):
        return [a for name, a in named if name.startswith(prefix + "[")]

    invs = None if scale_invs is None else group("scale_invs")
    return group("amax_histories"), group("scales"), invs, buffer


def delayed_scaling_update(
    amax_histories: Sequence[np.ndarray],
    scales: Sequence[np.ndarray],
    scale_invs: Sequence[np.ndarray] | None = None,
    *,
    amax_reduction_buffer: np.ndarray | None = None,
    amax_compute_algo: str = "max",
    fp8_dtype="e4m3",
    margin: float = 0.0,
) -> ScalingUpdate:
    """Roll each [L, n] amax history and recompute its scales, in place.

    Returns a ScalingUpdate; warns AmaxWarning when it is not ok (see the module doc)."""
    choice(amax_compute_algo, "amax_compute_algo", tuple(_ALGOS))
    histories, scale_list, invs, buffer = _state(amax_histories, scales, scale_invs, amax_reduction_buffer)
    code = int(_fp8_dtype(fp8_dtype))
    margin = real(margin, "margin")
    # (Shapes the core will refuse are left to its message.)
    well_formed = all(h.ndim == 2 and h.shape[0] >= 1 for h in histories) and (
        buffer is None or buffer.size == sum(h.shape[1] for h in histories)
    )
    suspect = _suspects(histories, buffer, amax_compute_algo) if well_formed else ()
    lib.delayed_scaling_update(
        None if buffer is None else desc(buffer),
        [desc(h) for h in histories],
        [desc(s) for s in scale_list],
        None if invs is None else [desc(s) for s in invs],
        _ALGOS[amax_compute_algo],
        code,
        margin,
    )
    if suspect:
        warnings.warn(
            f"delayed_scaling_update: the scale update of {len(suspect)} column(s) (first: tensor {suspect[0][0]}, "
            f"column {suspect[0][1]}) is driven by a non-finite amax or one above {SUSPECT_AMAX:g}; the scale "
            "follows the recipe's rule until that amax leaves the history window",
            AmaxWarning,
            stacklevel=2,
        )
    return ScalingUpdate(suspect)
