"""Benchmarks of the core's CUDA kernels against torch, measured in the same run.

Method: CUDA-event medians of 20 runs after 5 warm-ups (as shared targets).
Ceilings are measured here too: a 1 GiB device-to-device copy (bytes read +
written) and torch.matmul / torch._scaled_mm at 8192^3. Prints a table and
optionally writes it as Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import torch
from _timing import COLS, ROWS, Table, copy_ceiling_gbs, time_ms
from torch_desc import desc, stream

import transformer_engine.core as tc

lib = tc.lib


def bench_quantize(table: Table, copy_gbs: float) -> None:
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    row = torch.empty(ROWS, COLS, device="cuda", dtype=torch.float8_e4m3fn)
    col = torch.empty(COLS, ROWS, device="cuda", dtype=torch.float8_e4m3fn)
    scale, scale_inv, amax = (torch.ones((), device="cuda") for _ in range(3))
    dx, drow, dcol, ds, dsi, da = (desc(t) for t in (x, row, col, scale, scale_inv, amax))
    n = x.numel()

    def eager_torch():  # the baseline the reference compares against: amax, scale, cast
        a = x.abs().amax().float()
        s = 448.0 / a
        return (x.float() * s).clamp(-448, 448).to(torch.float8_e4m3fn), s.reciprocal()

    torch_ms = time_ms(eager_torch)
    cases = [
        (
            "current-scaling quantize, rowwise",
            lambda: lib.quantize_fp8_current_scaling(dx, drow, None, ds, dsi, da, False, 0.0, stream()),
            2 + 1 + 2,
            "<= 0.19 ms",
        ),
        (
            "current-scaling quantize, rowwise + columnwise",
            lambda: lib.quantize_fp8_current_scaling(dx, drow, dcol, ds, dsi, da, False, 0.0, stream()),
            2 + 2 + 2,
            "<= 0.25 ms",
        ),
        (
            "delayed-scaling quantize, rowwise",
            lambda: lib.quantize_fp8(dx, ds, drow, None, dsi, da, stream()),
            2 + 1,
            "",
        ),
        (
            "delayed-scaling quantize, rowwise + columnwise",
            lambda: lib.quantize_fp8(dx, ds, drow, dcol, dsi, da, stream()),
            2 + 2,
            ">= 80% of copy at 4 B/elem",
        ),
        ("amax", lambda: lib.compute_amax(dx, da, stream()), 2, ""),
    ]
    for name, fn, bytes_per_elem, target in cases:
        ms = time_ms(fn)
        gbs = n * bytes_per_elem / ms / 1e6
        baseline = ("torch eager amax+scale+cast", torch_ms) if "current" in name else ("", None)
        table.add(f"{name} 32768x4096 bf16", ms, gbs, "GB/s", gbs / copy_gbs, baseline[0], baseline[1], target)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--markdown", help="write the table as Markdown here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or not tc.built_with_cuda():
        print("bench: needs a CUDA GPU and a te-core built with CUDA", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    table = Table()
    copy_gbs = copy_ceiling_gbs()
    print(f"copy ceiling: {copy_gbs:.0f} GB/s (1 GiB device-to-device, read + write)")
    bench_quantize(table, copy_gbs)
    from bench_activation import bench_activation
    from bench_fp8_block import bench_fp8_block
    from bench_gemm import bench_gemm
    from bench_gemm_block import bench_gemm_block
    from bench_mxfp8 import bench_mxfp8
    from bench_nvfp4 import bench_nvfp4

    bench_gemm(table, time_ms)
    bench_fp8_block(table, time_ms, copy_gbs)
    bench_nvfp4(table, copy_gbs)
    bench_mxfp8(table, time_ms, copy_gbs)
    bench_gemm_block(table, time_ms)
    bench_activation(table, time_ms, copy_gbs)
    header = (
        f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} · "
        f"te-core {tc.__version__} · copy ceiling {copy_gbs:.0f} GB/s\n\n"
    )
    print("\n" + header + table.markdown())
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
