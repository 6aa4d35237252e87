"""te_gemm's timed FP8 algorithm choice (TE_GEMM_AUTOTUNE=all) gives correct
products.

With TE_GEMM_AUTOTUNE=all, the first call of a large FP8 GEMM configuration
times cuBLASLt's heuristic answers and tile/cluster variants of its first
answer's algorithm (core/src/gemm/algo_variants.cpp), runs the fastest, and
later calls reuse that choice. Whichever candidate wins, D must stay within
the bounds of the device GEMM tests (test_gemm.py) against the float64 product of the
dequantized inputs: split accumulation with the FP8 tensor-core and fused-bias
terms (gemm_device.device_reference on CUDA), fast accumulation within 1e-2 relative
Frobenius error (as test_fp8_fast_accumulation_is_close).

The core reads TE_GEMM_AUTOTUNE once per process, so the GEMMs run in a child
process started with it (CHILD below); each case runs twice there (the timing
call, then the cached choice), and this process checks both outputs. The
shapes reach the timing threshold of 2^32 multiply-adds; the second is ragged
(multiples of 16, as FP8 needs, but of no tile size).

A CUDA-only concern (cuBLASLt algorithm timing): the module is marked gpu.
Run on a GPU machine:  pytest -m gpu packages/te-core/tests/test_gemm_autotune.py
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transformer_engine.core as tec  # noqa: E402

HERE = Path(__file__).resolve().parent
import core_device  # noqa: E402
import gemm_device as gm  # noqa: E402
from gemm_device import BF16, E4M3, E5M2  # noqa: E402

from transformer_engine.core.reference_gemm import (  # noqa: E402
    assert_close,
    random_operand,
    random_operands,
    random_scale_inv,
    reference,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not tec.built_with_cuda(), reason="te-core was built without CUDA"),
    pytest.mark.gemm,
]

# (M, N, K, A's type, B's type): A stored [M, K], B stored [N, K] (the "TN"
# layout of the modules' FP8 GEMMs). 2048 * 2048 * 1024 = 2^32 exactly.
SHAPES = [(2048, 2048, 1024, E4M3, E4M3), (2064, 1552, 1360, E5M2, E4M3)]
CASES = [(shape, split, with_bias) for shape in SHAPES for split in (True, False) for with_bias in (False, True)]


def case_id(case) -> str:
    (m, n, k, a_dtype, b_dtype), split, with_bias = case
    accumulation = "split" if split else "fast"
    return f"{m}x{n}x{k}-{a_dtype}x{b_dtype}-{accumulation}-{'bf16bias' if with_bias else 'nobias'}"


# Runs every case of in.npz twice with gemm_device.device_gemm on CUDA (BF16 D)
# and saves the outputs; argv: the tests' folder, in.npz, out.npz. (.npz keeps
# no ml_dtypes types: FP8 and BF16 arrays travel as unsigned integers of their
# width, with their type's name under "<key>.dtype".)
CHILD = """
import sys
import ml_dtypes
import numpy as np
sys.path.insert(0, sys.argv[1])
import core_device
from gemm_device import BF16, device_gemm
data = np.load(sys.argv[2])
def get(key):
    return data[key].view(getattr(ml_dtypes, str(data[key + ".dtype"])))
outs = {}
for i in range(int(data["count"])):
    kw = dict(transb=True, out_dtype=BF16, a_scale_inv=data[f"{i}.sa"], b_scale_inv=data[f"{i}.sb"],
              use_split_accumulator=bool(data[f"{i}.split"]))
    if f"{i}.bias" in data:
        kw["bias"] = get(f"{i}.bias")
    for run in (0, 1):  # the timing call, then the cached choice
        with core_device.use("cuda"):
            outs[f"{i}.{run}"] = device_gemm(get(f"{i}.a"), get(f"{i}.b"), **kw).out.view(np.uint16)
np.savez(sys.argv[3], **outs)
"""


def put(arrays: dict, key: str, x: np.ndarray) -> None:
    """x (an ml_dtypes array) into `arrays` as CHILD's get() reads it."""
    arrays[key] = x.view(f"u{x.dtype.itemsize}")
    arrays[key + ".dtype"] = np.array(str(x.dtype))


@pytest.fixture(scope="module")
def tuned_runs(tmp_path_factory):
    """The cases' inputs and the child's outputs under TE_GEMM_AUTOTUNE=all."""
    seed = secrets.randbits(64)
    print(f"gemm autotune GPU test seed: {seed}")
    rng = np.random.default_rng(seed)
    inputs, arrays = [], {"count": np.array(len(CASES))}
    for i, ((m, n, k, a_dtype, b_dtype), split, with_bias) in enumerate(CASES):
        a, b = random_operands(rng, m, n, k, False, True, a_dtype, b_dtype)
        sa, sb = random_scale_inv(rng), random_scale_inv(rng, power_of_two=False)
        bias = random_operand(rng, (n,), BF16) if with_bias else None
        inputs.append((a, b, sa, sb, bias))
        arrays.update({f"{i}.sa": sa, f"{i}.sb": sb, f"{i}.split": np.array(split)})
        put(arrays, f"{i}.a", a)
        put(arrays, f"{i}.b", b)
        if bias is not None:
            put(arrays, f"{i}.bias", bias)
    folder = tmp_path_factory.mktemp("gemm_autotune")
    np.savez(folder / "in.npz", **arrays)
    env = dict(os.environ, TE_GEMM_AUTOTUNE="all")
    args = [sys.executable, "-c", CHILD, str(HERE), str(folder / "in.npz"), str(folder / "out.npz")]
    subprocess.run(args, env=env, check=True)
    outs = np.load(folder / "out.npz")
    return inputs, {key: outs[key].view(BF16) for key in outs.files}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(c) for c in CASES])
def test_tuned_fp8_gemm_matches_reference(tuned_runs, index):
    inputs, outs = tuned_runs
    _, split, _ = CASES[index]
    a, b, sa, sb, bias = inputs[index]
    kw = {"transb": True, "a_scale_inv": sa, "b_scale_inv": sb, "bias": bias}
    if split:
        with core_device.use("cuda"):  # (the bound with the CUDA terms)
            ref = gm.device_reference(a, b, out_dtype=BF16, extra_roundings=gm.FP8_EXTRA_ROUNDINGS, **kw)
    else:
        ref = reference(a, b, **kw)
    for run, what in ((0, "D (timing call)"), (1, "D (cached choice)")):
        out = outs[f"{index}.{run}"]
        assert out.shape == (a.shape[0], b.shape[0])
        if split:
            assert_close(out, ref.out, ref.err32, what)
        else:
            # Fast accumulation keeps fewer accumulator bits: only a loose check.
            rel = np.linalg.norm(out.astype(np.float64) - ref.out) / np.linalg.norm(ref.out)
            assert rel < 1e-2, f"{what}: relative Frobenius error {rel:.2e}"
