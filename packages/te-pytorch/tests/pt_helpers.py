"""Helpers of the te-pytorch tests: hostile inputs and FP8 error bounds.

(A uniquely named module, not conftest: pytest runs the te-core and
te-pytorch suites in one session and same-named modules would collide.)
"""

from __future__ import annotations

import torch

import transformer_engine.core as te_core
from transformer_engine.core.testing.tolerances import unit_roundoff, unit_roundoffs


def cuda_ready() -> bool:
    """A CUDA device visible to torch and a te-core build with the CUDA backend."""
    return torch.cuda.is_available() and te_core.built_with_cuda()


FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
# Largest FP8 value below the first normal, spaced like the subnormals.
SUBNORMAL_STEP = {"e4m3": 2.0**-9, "e5m2": 2.0**-16}
UNIT_ROUNDOFF = unit_roundoffs("e4m3", "e5m2")


def hostile(shape, dtype=torch.float32, device="cpu", fmt="e4m3"):
    """Random values laced with 0, -0, denormals, +-inf, NaN, huge values and
    values above the FP8 maximum."""
    n = 1
    for d in shape:
        n *= d
    scales = torch.tensor([1e-3, 1.0, 30.0, 1e3])[torch.randint(0, 4, (n,))]
    x = torch.randn(n) * scales
    tiny = torch.finfo(dtype).smallest_normal / 4
    specials = torch.tensor(
        [
            0.0,
            -0.0,
            tiny,
            -tiny,
            float("inf"),
            float("-inf"),
            float("nan"),
            1e5,
            -7e4,
            449.0,
            -460.0,
            FP8_MAX[fmt] * 1.5,
        ]
    )
    mask = torch.rand(n) < 0.25
    x[mask] = specials[torch.randint(0, len(specials), (int(mask.sum()),))]
    return x.to(dtype).reshape(shape).to(device)


def fp8_error(t: torch.Tensor, fmt: str, scale: float) -> torch.Tensor:
    """Elementwise bound of |dequant(quant(t)) - t| for per-tensor FP8 with
    `scale` and no saturation: round-to-nearest-even gives a relative error
    of at most u (2^-4 for E4M3's 3 mantissa bits, 2^-3 for E5M2's 2) in the
    normal range, and half a subnormal step (in the scaled domain) below it."""
    return UNIT_ROUNDOFF[fmt] * t.abs() + SUBNORMAL_STEP[fmt] / 2 / scale


# cuBLASLt's FP8 "fast accumulation" (use_split_accumulator=False, the fprop
# default) keeps fewer accumulator bits than FP32 (about 14 on Hopper, as the
# DeepSeek-V3 report measured): 2^-12 per addition bounds it safely.
FAST_ACCUM_U = 2.0**-12


# Hopper FP8 tensor cores truncate each 32-product step to ~14 significant bits even with
# the split accumulator (transformer_engine.core.reference_gemm: (ceil(K/32) + 1) 2^-13 S).
# As a per-step unit for K u S: (ceil(K/32) + 1) / K <= 1/8 for every K >= 16.
SPLIT_ACCUM_FP8_U = 2.0**-13 / 8


def accumulation_u(device, split_accumulator: bool) -> float:
    """Unit roundoff of one FP8 GEMM accumulation step on this device (K >= 16)."""
    if torch.device(device).type != "cuda":
        return 2.0**-24
    return SPLIT_ACCUM_FP8_U if split_accumulator else max(FAST_ACCUM_U, SPLIT_ACCUM_FP8_U)


def matmul_bound(a, b, err_a, err_b, out_dtype, acc_u: float = 2.0**-24) -> torch.Tensor:
    """Elementwise bound of |y - a b^T| (float64) for y computed from operands
    within err_a / err_b of a / b, accumulation over K (unit roundoff acc_u:
    FP32 by default) and rounding to out_dtype:
                |a||e_b|^T + |e_a||b|^T + e_a e_b^T  (operand errors)
              + K acc_u (|a| + e_a)(|b| + e_b)^T     (accumulation)
              + u_out |a b^T|                        (output rounding)."""
    a, b, err_a, err_b = (t.double() for t in (a, b, err_a, err_b))
    k = a.shape[-1]
    operand = a.abs() @ err_b.T + err_a @ b.abs().T + err_a @ err_b.T
    accumulation = k * acc_u * (a.abs() + err_a) @ (b.abs() + err_b).T
    u_out = unit_roundoff(out_dtype)
    output = u_out * (a @ b.T).abs() * (1 + 2.0**-4) + u_out * operand
    return operand + accumulation + output + 1e-30


def assert_within(actual, expected, bound, what: str) -> None:
    err = (actual.double() - expected.double()).abs()
    bad = err > bound.double()
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {err.numel()} elements outside the "
            f"bound; first at flat index {i}: |err| = {err.flatten()[i].item():.3e}"
            f" > bound {bound.flatten()[i].item():.3e}"
        )


def assert_fullgraph_matches_eager(fn, run) -> None:
    """run(f) returns tensors computed with f; torch.compile(fn, fullgraph=True) on the
    aot_eager backend (the same kernels as eager) must give identical ones."""
    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        for got, expected in zip(run(compiled), run(fn)):
            assert torch.equal(got, expected)
    finally:
        torch._dynamo.reset()
