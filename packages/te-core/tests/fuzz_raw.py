"""Raw-binding cases of the bad-input campaign (fuzz_runner.py): the nanobind
functions called with TensorDesc descriptors as a framework would build them,
one of them spoiled: a wrong dtype code, rank or shape, a negative or
overflowing dimension, an unknown device, a NULL data pointer, or the buffer
of another argument (aliasing).

Every descriptor points into its own buffer of BUFFER_BYTES, and every claimed
extent either fits that buffer or overflows 64-bit arithmetic (which the core
must refuse): a descriptor larger than its memory but representable is the
caller breaking the C API's contract, not an input the core could detect.
"""

from __future__ import annotations

import numpy as np

from transformer_engine.core import lib

BUFFER_BYTES = 1 << 16
MAX_ELEMENTS = BUFFER_BYTES // 8  # every dtype fits: at most 8 bytes per element
F32, BF16, F16, E4M3, E5M2, E8M0, BYTE = 4, 6, 5, 7, 8, 9, 0
HP = (F32, BF16, F16)


class Spec:
    """A descriptor to build: dtype code, shape, device type, data (own buffer, another's, or NULL)."""

    def __init__(self, dtype, shape, device=0):
        self.dtype, self.shape, self.device, self.data = dtype, list(shape), device, "own"


def _desc(spec, buffers, name):
    if spec.data == "null":
        pointer = 0
    else:
        pointer = buffers[name if spec.data == "own" else spec.data].ctypes.data
    return lib.TensorDesc(pointer, spec.dtype, spec.shape, spec.device, 0)


def _rows_cols(rng, cols_multiple=1):
    return int(rng.integers(1, 17)), cols_multiple * int(rng.integers(1, 65 // cols_multiple + 1))


def _entries(rng):
    """name -> (descriptor specs in call order, call(descs) -> None)."""
    m, k = _rows_cols(rng)
    hp = int(rng.choice(HP))
    fp8 = int(rng.choice([E4M3, E5M2]))
    g = int(rng.integers(0, 12))
    return {
        "compute_amax": ({"input": Spec(hp, [m, k]), "amax": Spec(F32, [])}, lambda d: lib.compute_amax(*d.values())),
        "transpose": ({"input": Spec(hp, [m, k]), "output": Spec(hp, [k, m])}, lambda d: lib.transpose(*d.values())),
        "quantize_fp8": (
            {
                "input": Spec(hp, [m, k]),
                "scale": Spec(F32, []),
                "rowwise": Spec(fp8, [m, k]),
                "columnwise": Spec(fp8, [k, m]),
                "scale_inv": Spec(F32, []),
                "amax": Spec(F32, []),
            },
            lambda d: lib.quantize_fp8(*d.values()),
        ),
        "dequantize_fp8": (
            {"input": Spec(fp8, [m, k]), "scale_inv": Spec(F32, []), "output": Spec(hp, [m, k])},
            lambda d: lib.dequantize_fp8(*d.values()),
        ),
        "rmsnorm_fwd": (
            {"x": Spec(hp, [m, k]), "gamma": Spec(hp, [k]), "y": Spec(hp, [m, k]), "rsigma": Spec(F32, [m])},
            lambda d: lib.rmsnorm_fwd(d["x"], d["gamma"], 1e-5, False, d["y"], None, None, None, d["rsigma"]),
        ),
        "layernorm_fwd": (
            {
                "x": Spec(hp, [m, k]),
                "gamma": Spec(hp, [k]),
                "beta": Spec(hp, [k]),
                "y": Spec(hp, [m, k]),
                "mu": Spec(F32, [m]),
                "rsigma": Spec(F32, [m]),
            },
            lambda d: lib.layernorm_fwd(
                d["x"], d["gamma"], d["beta"], 1e-5, False, d["y"], None, None, None, d["mu"], d["rsigma"]
            ),
        ),
        "delayed_scaling_update": (
            {"history": Spec(F32, [4, k]), "scale": Spec(F32, [k]), "scale_inv": Spec(F32, [k])},
            lambda d: lib.delayed_scaling_update(
                None, [d["history"]], [d["scale"]], [d["scale_inv"]], lib.AmaxComputeAlgo.MAX, E4M3
            ),
        ),
        "swizzle_block_scales": (
            {"input": Spec(E8M0, [128, 4]), "output": Spec(E8M0, [128, 4])},
            lambda d: lib.swizzle_block_scales(*d.values()),
        ),
        "gemm": (
            {"a": Spec(hp, [16, 16]), "b": Spec(hp, [16, 16]), "d": Spec(F32, [16, 16])},
            lambda d: lib.gemm(*d.values(), transb=True),
        ),
        "scaled_softmax_fwd": (
            {"x": Spec(hp, [m, k]), "y": Spec(hp, [m, k])},
            lambda d: lib.scaled_softmax_fwd(d["x"], 1.0, d["y"]),
        ),
        "activation_fwd": (
            {"input": Spec(hp, [m, 2 * k]), "output": Spec(hp, [m, k if g in _gated() else 2 * k])},
            lambda d: lib.activation_fwd(g, d["input"], d["output"]),
        ),
    }


def _gated():
    return {k["code"] for k in lib.activation_kinds() if k["gated"]}


def _fits(shape) -> bool:
    return all(d >= 0 for d in shape) and int(np.prod(shape, dtype=object)) <= MAX_ELEMENTS


def _spoil(rng, specs: dict) -> str:
    """Spoils one descriptor; returns what was done."""
    name = str(rng.choice(list(specs)))
    s = specs[name]
    how = int(rng.integers(8))
    if how == 0:
        s.dtype = int(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 99, -1]))
    elif how == 1:  # another rank, same elements or fewer
        s.shape = [int(v) for v in rng.integers(1, 4, int(rng.integers(0, 9)))]
        if not _fits(s.shape):
            s.shape = [1]
    elif how == 2:
        s.shape = [
            int(rng.choice([2**32, 2**62, 6148914691236517206, 2**61, 2**31])),
            int(rng.choice([2**32, 3, 4, 2**33])),
        ]
        if _fits(s.shape):
            s.shape = [2**62, 4]
    elif how == 3:
        s.shape = [-int(rng.integers(1, 5))] + s.shape[1:]
    elif how == 4:
        s.device = int(rng.choice([1, 2, 77]))
    elif how == 5:
        s.data = "null"
    elif how == 6:  # the buffer of another argument: aliasing
        s.data = str(rng.choice([n for n in specs if n != name] or [name]))
    else:  # an off-by-one dimension that still fits
        s.shape = [max(0, d + int(rng.choice([-1, 1]))) for d in s.shape]
    return f"{name}:{['dtype', 'rank', 'overflow', 'negative', 'device', 'null', 'alias', 'off-by-one'][how]}"


def make_case(rng):
    """A raw-binding case in fuzz_runner's form (no oracle: the check is 'no crash, clear error')."""
    entries = _entries(rng)
    name = str(rng.choice(list(entries)))
    specs, call = entries[name]
    spoiled = _spoil(rng, specs) if rng.random() < 0.85 else None
    buffers = {n: np.zeros(BUFFER_BYTES // 4, np.float32) for n in specs}

    def run():
        descs = {n: _desc(s, buffers, n) for n, s in specs.items()}
        return call(descs)

    return f"raw.{name}", lambda: run(), {}, None, spoiled
