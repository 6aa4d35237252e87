"""RoPE cases shared by the CPU and GPU tests: layouts, partial rotary, thd with empty and
trailing-padding sequences, context parallelism, start positions; hostile inputs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from conftest import finfo

FLOAT_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


class Case:
    def __init__(self, name, fmt, shape, d2, *, rows=None, cu=None, starts=None, cp=(1, 0)):
        self.name, self.fmt, self.shape, self.d2 = name, fmt, shape, d2
        self.rows, self.cu, self.starts, (self.cp_size, self.cp_rank) = rows, cu, starts, cp

    def __repr__(self):
        return self.name

    def kwargs(self):
        return dict(
            tensor_format=self.fmt,
            start_positions=None if self.starts is None else np.array(self.starts, np.int32),
            cu_seqlens=None if self.cu is None else np.array(self.cu, np.int32),
            cp_size=self.cp_size,
            cp_rank=self.cp_rank,
        )


CASES = [
    Case("sbhd-full", "sbhd", (5, 3, 2, 16), 16),
    Case("sbhd-partial", "sbhd", (7, 2, 3, 24), 8, rows=11),
    Case("bshd-odd", "bshd", (2, 9, 3, 10), 6),
    Case("bshd-1x1", "bshd", (1, 1, 1, 2), 2),
    Case("bshd-start", "bshd", (3, 4, 2, 8), 8, rows=20, starts=[0, 5, 16]),
    Case("sbhd-start", "sbhd", (4, 2, 1, 12), 4, rows=9, starts=[5, 1]),
    Case("thd", "thd", (15, 2, 12), 12, rows=8, cu=[0, 3, 3, 10, 13]),
    Case("thd-partial", "thd", (20, 3, 16), 6, rows=20, cu=[0, 20]),
    Case("thd-start", "thd", (9, 1, 8), 8, rows=12, cu=[0, 4, 9], starts=[2, 7]),
    Case("sbhd-cp2-r0", "sbhd", (6, 2, 2, 8), 8, rows=12, cp=(2, 0)),
    Case("sbhd-cp2-r1", "sbhd", (6, 2, 2, 8), 8, rows=12, cp=(2, 1)),
    Case("bshd-cp3-r2", "bshd", (2, 4, 1, 6), 4, rows=12, cp=(3, 2)),
    Case("thd-cp2-r1", "thd", (10, 2, 8), 8, rows=12, cu=[0, 8, 8, 20], cp=(2, 1)),
    Case("thd-cp2-r0", "thd", (12, 1, 10), 6, rows=16, cu=[0, 16, 24], cp=(2, 0)),
]


def freqs_for(rng, rows, d2, *, duplicated=False, interleaved=False, large=False) -> np.ndarray:
    """FP32 [rows, 1, 1, d2]: general angles, or (duplicated) RotaryPositionEmbedding's,
    equal at i and its partner (halves [f, f], interleaved [f0, f0, f1, f1, ...]);
    `large` reaches 1e4 rad (range reduction)."""
    span = 1e4 if large else 8.0
    if duplicated:
        half = rng.uniform(-span, span, (rows, d2 // 2))
        f = np.repeat(half, 2, axis=-1) if interleaved else np.concatenate([half, half], axis=-1)
    else:
        f = rng.uniform(-span, span, (rows, d2))
    f[0, :] = 0.0  # sin 0 = 0 exactly
    return f.astype(np.float32).reshape(rows, 1, 1, d2)


def rope_input(rng, shape, dtype, *, specials=True) -> np.ndarray:
    """Values of varied magnitude with zeros, denormals and (with `specials`) inf/NaN."""
    x = rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 100.0], shape)
    tiny = float(finfo(dtype).smallest_subnormal)
    flat = x.reshape(-1)
    m = rng.random(flat.size) < 0.05
    flat[m] = rng.choice([0.0, -0.0, tiny, -3 * tiny], int(m.sum()))
    if specials and flat.size >= 8:
        flat[rng.integers(flat.size)] = np.inf
        flat[rng.integers(flat.size)] = -np.inf
        flat[rng.integers(flat.size)] = np.nan
    return x.astype(dtype)


def case_inputs(rng, case, dtype, **freq_kw):
    s = case.shape[0] if case.fmt == "sbhd" else case.shape[1]
    rows = case.rows or (case.shape[0] if case.fmt == "thd" else s)
    return rope_input(rng, case.shape, dtype), freqs_for(rng, rows, case.d2, **freq_kw)
