"""Host cost of one call, layer by layer, on the GPU machine's CPU: what a te-pytorch kernel
wrapper adds to the te-core binding call, and what the binding call itself costs next to the
torch op doing the same work. Small shapes (the GPU finishes each call long before the host
issues the next), so the time per call is the host's.

Rows: torch.empty; torch.mm; te-core's lib.gemm with descriptors made once (BF16 and FP8);
kernels.gemm (the te-pytorch wrapper); lib.quantize_fp8 with descriptors made once; the
te-pytorch delayed-scaling quantize (quantize_fp8_prepared).

    python bench/bench_call_overhead.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from transformer_engine.core import lib
from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels._common import FLOAT32, desc, workspace
from transformer_engine.pytorch.kernels.cast import quantize_fp8_prepared

E4M3 = 7


def _us_per_call(fn, calls: int, rounds: int = 5) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    a = torch.randn(256, 1024, device=dev, dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    d = torch.empty(256, 1024, device=dev, dtype=torch.bfloat16)
    a8 = torch.randint(0, 100, (256, 1024), device=dev, dtype=torch.uint8)
    b8 = torch.randint(0, 100, (1024, 1024), device=dev, dtype=torch.uint8)
    one = torch.ones(1, device=dev, dtype=torch.float32)
    scale_inv = torch.ones(1, device=dev, dtype=torch.float32)
    bf16 = kernels._common.TORCH_TO_CODE[torch.bfloat16]
    ad, bd, dd = desc(a, bf16), desc(b, bf16), desc(d, bf16)
    a8d, b8d, sd = desc(a8, E4M3), desc(b8, E4M3), desc(scale_inv, FLOAT32)
    none6 = (None,) * 6

    def ws_for(adesc, bdesc, asd, bsd):
        n = lib.gemm_workspace_size(adesc, bdesc, dd, asd, bsd, *none6, 1.0, 0.0, False, True, False)
        return workspace(n, a, stream)

    ws16, ws8 = ws_for(ad, bd, None, None), ws_for(a8d, b8d, sd, sd)
    row = torch.empty(256, 1024, device=dev, dtype=torch.uint8)
    rowd, oned = desc(row, E4M3), desc(one, FLOAT32)
    cases = {
        "torch.empty (256x1024 bf16)": lambda: torch.empty(256, 1024, device=dev, dtype=torch.bfloat16),
        "torch.mm (256x1024 @ 1024x1024 bf16)": lambda: torch.mm(a, b.t()),
        "lib.gemm BF16, descriptors made once": lambda: lib.gemm(
            ad, bd, dd, None, None, *none6, ws16, 1.0, 0.0, False, True, False, stream
        ),
        "lib.gemm FP8, descriptors made once": lambda: lib.gemm(
            a8d, b8d, dd, sd, sd, *none6, ws8, 1.0, 0.0, False, True, False, stream
        ),
        "kernels.gemm BF16 (te-pytorch wrapper)": lambda: kernels.gemm(a, b, transb=True, out_dtype=torch.bfloat16),
        "lib.quantize_fp8, descriptors made once": lambda: lib.quantize_fp8(ad, oned, rowd, None, sd, None, stream),
        "quantize_fp8_prepared (te-pytorch)": lambda: quantize_fp8_prepared(a, oned, None, E4M3, True, False),
    }
    print(f"torch {torch.__version__}; host cost per call, median of 5 rounds of {args.calls} calls")
    for name, fn in cases.items():
        print(f"  {name:42s} {_us_per_call(fn, args.calls):7.2f} us")


if __name__ == "__main__":
    main()
