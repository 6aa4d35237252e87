"""GEMM benchmarks: the core's cuBLASLt path against torch in the same run (8192^3)."""

from __future__ import annotations

import torch
from torch_desc import desc, stream

import transformer_engine.core as tc

lib = tc.lib
SIZE = 8192


class CoreGemm:
    """One te_gemm call with descriptors and workspace prepared once (what a module does)."""

    def __init__(
        self, a, b, d, transa=False, transb=False, a_scale_inv=None, b_scale_inv=None, use_split_accumulator=True
    ):
        self.args = dict(
            a_scale_inv=None if a_scale_inv is None else desc(a_scale_inv),
            b_scale_inv=None if b_scale_inv is None else desc(b_scale_inv),
            transa=transa,
            transb=transb,
            use_split_accumulator=use_split_accumulator,
        )
        self.a, self.b, self.d = desc(a), desc(b), desc(d)
        size = lib.gemm_workspace_size(self.a, self.b, self.d, **self.args)
        self.workspace_tensor = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
        self.workspace = desc(self.workspace_tensor)

    def __call__(self):
        lib.gemm(self.a, self.b, self.d, workspace=self.workspace, stream=stream(), **self.args)


def bench_gemm(table, time_ms) -> None:
    n = SIZE
    flops = 2.0 * n**3
    tflops = lambda ms: flops / ms / 1e9  # noqa: E731
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)

    torch_bf16 = time_ms(lambda: torch.matmul(x, w.t()))
    ours = time_ms(CoreGemm(x, w, y, transb=True))
    table.add(
        "BF16 GEMM 8192^3 (x @ w^T)",
        ours,
        tflops(ours),
        "TFLOP/s",
        ours and torch_bf16 / ours,
        "torch.matmul",
        torch_bf16,
        ">= 95% of torch.matmul",
    )
    # torch.matmul goes through cuBLAS (cublasGemmEx) by default, which picks its
    # kernel its own way; ours and torch's cuBLASLt paths take cuBLASLt's first
    # heuristic answer. The same product through torch's cuBLASLt backend tells
    # the two apart.
    previous = torch.backends.cuda.preferred_blas_library()
    try:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        torch_lt = time_ms(lambda: torch.matmul(x, w.t()))
    finally:
        torch.backends.cuda.preferred_blas_library(previous)
    table.add(
        "BF16 GEMM 8192^3 (x @ w^T), vs torch's cuBLASLt backend",
        ours,
        tflops(ours),
        "TFLOP/s",
        torch_lt / ours,
        "torch.matmul (cublaslt)",
        torch_lt,
        "",
    )

    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    for fast_accum in (False, True):
        torch_fp8 = time_ms(
            lambda: torch._scaled_mm(
                x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
            )
        )
        gemm = CoreGemm(x8, w8, y, transb=True, a_scale_inv=one, b_scale_inv=one, use_split_accumulator=not fast_accum)
        ours = time_ms(gemm)
        mode = "fast accumulation" if fast_accum else "split accumulator"
        table.add(
            f"FP8 E4M3 GEMM 8192^3 TN, {mode}",
            ours,
            tflops(ours),
            "TFLOP/s",
            torch_fp8 / ours,
            "torch._scaled_mm",
            torch_fp8,
            ">= 95% of torch._scaled_mm",
        )
    # dgrad layout (dy @ w, no transposes): Hopper FP8 needs TN, so the core transposes w first.
    nn = CoreGemm(x8, w8, y, a_scale_inv=one, b_scale_inv=one)
    ours = time_ms(nn)
    table.add("FP8 E4M3 GEMM 8192^3 NN (core transposes B)", ours, tflops(ours), "TFLOP/s", 0.0)
