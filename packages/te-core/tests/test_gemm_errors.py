"""te_gemm's errors: ValueError for shapes and values, TypeError for types,
each naming the argument and the rule (on CUDA: the same messages as on the CPU)."""

from __future__ import annotations

import gemm_device as gm
import numpy as np
import pytest
from conftest import CUDA_ONLY
from gemm_device import E4M3, E5M2, F32

import transformer_engine.core as tec
from transformer_engine.core import lib
from transformer_engine.core._arrays import desc
from transformer_engine.core.reference_gemm import (
    random_operand,
    random_operands,
)

pytestmark = pytest.mark.gemm


# ---------------------------------------------------------------------------
# Errors: ValueError for shapes and values, TypeError for types, each naming
# the argument and the rule.


def test_fp8_dims_must_be_multiples_of_16(rng):
    a, b = random_operands(rng, 100, 64, 48, False, True, E4M3, E4M3)
    with pytest.raises(ValueError, match=r"divisible by 16 \(got M=100, N=64, K=48\).*pad"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)


def test_both_e5m2_rejected(rng):
    a, b = random_operands(rng, 16, 16, 16, False, True, E5M2, E5M2)
    with pytest.raises(TypeError, match="cannot both be float8_e5m2"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"b": np.ones((3, 2), np.float16)}, "'a' and 'b' must have the same type"),
        ({"a": np.ones((2, 3), np.float64)}, "argument 'a' must be"),
        ({"bias": np.ones(2, np.int32)}, "argument 'bias' must be"),
        ({"c": np.ones((2, 2), np.float16), "beta": 1.0}, "argument 'c' must be float32"),
        ({"out_dtype": np.int32}, "argument 'out_dtype' must be"),
        ({"a": np.ones((16, 16), E4M3), "b": np.ones((16, 16), np.float32)}, "both be FP8"),
    ],
)
def test_type_errors_name_the_argument(kwargs, pattern):
    args = {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 2), np.float32)}
    args.update(kwargs)
    a, b = args.pop("a"), args.pop("b")
    if a.dtype == E4M3:
        args["a_scale_inv"] = 1.0
    with pytest.raises(TypeError, match=pattern):
        tec.gemm(a, b, **args)


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        ({"b": np.ones((4, 2), np.float32)}, "inner dimensions differ"),
        ({"bias": np.ones(3, np.float32)}, r"'bias' must have shape \[N\] = \[2\]"),
        ({"c": np.ones((2, 3), np.float32), "beta": 1.0}, r"'c' must be a \[2, 2\] matrix"),
        ({"beta": 1.0}, "'beta' is 1 but 'c' is NULL"),
        ({"a_scale_inv": 1.0}, "'a_scale_inv' is only for an FP8 'a'"),
        ({"alpha": float("nan")}, "must be finite"),
    ],
)
def test_value_errors_name_the_argument(kwargs, pattern):
    b = kwargs.pop("b", np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match=pattern):
        tec.gemm(np.ones((2, 3), np.float32), b, **kwargs)


def test_fp8_scales_are_required(rng):
    a, b = random_operands(rng, 16, 16, 16, False, True, E4M3, E4M3)
    with pytest.raises(ValueError, match="'b_scale_inv' is required when 'b' is FP8"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0)
    with pytest.raises(ValueError, match="'d_scale' is required when 'd' is FP8"):
        tec.gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0, out_dtype=E4M3)


def test_workspace_too_small_on_cpu_is_fine_but_wrong_type_is_not(rng):
    a, b = random_operands(rng, 5, 7, 3, False, False, np.float32, np.float32)
    d = np.empty((5, 7), np.float32)
    ws = np.empty(16, np.float32)
    with pytest.raises(TypeError, match="argument 'workspace' must be byte"):
        lib.gemm(desc(a), desc(b), desc(d), workspace=desc(ws))
    lib.gemm(desc(a), desc(b), desc(d), workspace=desc(np.empty(0, np.uint8)))


@CUDA_ONLY
def test_cuda_errors_match_the_cpu(device, rng):
    a, b = random_operands(rng, 100, 64, 48, False, True, E4M3, E4M3)
    with pytest.raises(ValueError, match="pad the tensors to a multiple of 16"):
        gm.device_gemm(a, b, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    x = random_operand(rng, (16, 16), E5M2)
    with pytest.raises(TypeError, match="cannot both be float8_e5m2"):
        gm.device_gemm(x, x, transb=True, a_scale_inv=1.0, b_scale_inv=1.0)
    host = np.ones((2, 2), np.float32)
    gpu = gm.DeviceArray((2, 2), F32)
    with pytest.raises(ValueError, match="must be on the device of 'a'"):
        lib.gemm(desc(host), gpu.desc(), gpu.desc())
