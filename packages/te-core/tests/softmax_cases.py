"""Fused softmax cases shared by the CPU and GPU tests: the four variants on odd shapes,
long rows, fully masked rows, hostile logits."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import transformer_engine.core as tc

FLOAT_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]

# (kind, shape): plain takes any rank; masked / bottom_right [b, h, sq, sk]; causal [n, s, s].
CASES = [
    ("plain", (7,)),
    ("plain", (3, 5, 33)),
    ("plain", (2, 3, 4, 100)),
    ("plain", (4, 2049)),
    ("masked", (2, 3, 5, 37)),
    ("masked", (1, 2, 4, 64)),
    ("masked", (3, 1, 7, 1)),
    ("causal", (5, 9, 9)),
    ("causal", (2, 1, 1)),
    ("causal", (3, 70, 70)),
    ("bottom_right", (2, 2, 5, 9)),
    ("bottom_right", (1, 3, 9, 5)),  # sq > sk: the first rows see nothing
    ("bottom_right", (2, 1, 33, 33)),
]

FORWARD = {
    "plain": tc.scaled_softmax_forward,
    "masked": tc.scaled_masked_softmax_forward,
    "causal": tc.scaled_upper_triang_masked_softmax_forward,
    "bottom_right": tc.scaled_aligned_causal_masked_softmax_forward,
}
BACKWARD = {
    "plain": tc.scaled_softmax_backward,
    "masked": tc.scaled_masked_softmax_backward,
    "causal": tc.scaled_upper_triang_masked_softmax_backward,
    "bottom_right": tc.scaled_aligned_causal_masked_softmax_backward,
}


def case_id(case) -> str:
    kind, shape = case
    return f"{kind}-{'x'.join(map(str, shape))}"


def logits(rng, shape, dtype, *, specials=True) -> np.ndarray:
    """Rows of varied spread (tiny to large: exp underflows), an all -inf row, and (with
    `specials`) a NaN row and a +inf row."""
    n = int(np.prod(shape[:-1], dtype=np.int64))
    sk = shape[-1]
    x = rng.standard_normal((n, sk)) * rng.choice([1e-3, 1.0, 10.0, 200.0], (n, 1))
    x += rng.choice([0.0, 50.0, -300.0], (n, 1))
    x[rng.random((n, sk)) < 0.05] = 0.0
    if n >= 4:
        x[1, :] = -np.inf
        x[3, rng.integers(sk)] = -np.inf
    if specials and n >= 6:
        x[4, rng.integers(sk)] = np.nan
        x[5, rng.integers(sk)] = np.inf
    return x.astype(dtype).reshape(shape)


def mask_for(rng, shape, broadcast: bool) -> np.ndarray:
    """uint8 [b or 1, 1, sq, sk] with ~30% masked and one fully masked row."""
    b, _, sq, sk = shape
    m = (rng.random((1 if broadcast else b, 1, sq, sk)) < 0.3).astype(np.uint8)
    m[0, 0, sq - 1, :] = 1
    m[m == 1] = rng.choice([1, 7, 255], int((m == 1).sum())).astype(np.uint8)
    return m


def inputs(rng, case, dtype, scale_choice=None):
    kind, shape = case
    x = logits(rng, shape, dtype)
    mask = mask_for(rng, shape, broadcast=shape[0] == 1 or rng.random() < 0.5) if kind == "masked" else None
    scale = scale_choice if scale_choice is not None else float(rng.choice([1.0, 0.125, 3.0, -0.5]))
    return x, mask, scale


def forward(kind, x, mask, scale):
    return FORWARD[kind](x, mask, scale) if kind == "masked" else FORWARD[kind](x, scale)
