"""Delayed-scaling update op: torch.ops.te.delayed_scaling_update.

te-core's te_delayed_scaling_update (core/include/te/recipe.h) updates many
tensors' amax histories [L, n_k] and scales [n_k] in one launch: per column,
last = the reduced amax (when a reduction buffer is given and it is nonzero)
or history[0]; when last != 0 the history rolls by -1 with last at the end and
row 0 zeroed, and scale = (fp8_max * 2^-margin) / amax (amax = window max or
last); amax 0, inf or NaN keeps the old scale, an infinite scale becomes
FLT_MAX. The tensors are updated in place.
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer_engine.core import lib

from ._common import FLOAT32, desc, stream_of, te_op
from .cast import _check_fp8

ALGOS = {"max": lib.AmaxComputeAlgo.MAX, "most_recent": lib.AmaxComputeAlgo.MOST_RECENT}


@te_op("delayed_scaling_update", mutates_args=("histories", "scales"))
def delayed_scaling_update(
    buffer: Tensor | None,
    histories: list[Tensor],
    scales: list[Tensor],
    *,
    algo: str = "max",
    fp8_dtype: int,
    margin: float = 0.0,
) -> None:
    """Roll each FP32 [L, n_k] history and recompute its FP32 [n_k] scales in place.

    buffer: None, or the FP32 concatenation of every history's row 0 after an
    all-reduce (MAX) across ranks.
    """
    _check_fp8(fp8_dtype)
    if algo not in ALGOS:
        raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {algo!r}")
    if not histories:
        return
    for name, group in (("amax_histories", histories), ("scales", scales)):
        for i, t in enumerate(group):
            if t.dtype != torch.float32 or not t.is_contiguous():
                raise TypeError(
                    f"argument '{name}[{i}]' must be a contiguous float32 tensor "
                    f"(it is updated in place), got {t.dtype}"
                )
    lib.delayed_scaling_update(
        None if buffer is None else desc(buffer, FLOAT32),
        [desc(h, FLOAT32) for h in histories],
        [desc(s, FLOAT32) for s in scales],
        None,
        ALGOS[algo],
        fp8_dtype,
        margin,
        stream_of(histories[0]),
    )
