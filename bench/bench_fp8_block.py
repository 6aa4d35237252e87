"""FP8 block-scaling kernels at 32768x4096 BF16 (called from bench_core.py).

Bytes counted per element: 2 read + 1 per FP8 output (+ 4 bytes per 128
elements of scales per output). The target is 70% of the measured copy ceiling
for rowwise + columnwise (GEMM-ready, the layout a training step writes).
"""

from __future__ import annotations

import torch
from torch_desc import desc, stream

import transformer_engine.core as tc

lib = tc.lib
ROWS, COLS = 32768, 4096


def _buffers(block_dim: int, layout: int, rowwise: bool, columnwise: bool):
    name = {0: "gemm_ready", 1: "compact"}[layout]
    out = []
    for wanted, col in ((rowwise, False), (columnwise, True)):
        if not wanted:
            out += [None, None]
            continue
        shape = (COLS, ROWS) if col and layout == 0 else (ROWS, COLS)
        scales = tc.fp8_block_scale_shape((ROWS, COLS), block_dim=block_dim, layout=name, columnwise=col)
        out += [
            torch.empty(shape, device="cuda", dtype=torch.float8_e4m3fn),
            torch.empty(scales, device="cuda", dtype=torch.float32),
        ]
    return out


def bench_fp8_block(table, time_ms, copy_gbs: float) -> None:
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    n = x.numel()
    dx = desc(x)
    cases = [
        ("FP8-block 1-D quantize, rowwise + columnwise", 1, 0, True, True, ">= 70% of copy"),
        ("FP8-block 1-D quantize, rowwise", 1, 0, True, False, ""),
        ("FP8-block 1-D quantize, columnwise", 1, 0, False, True, ""),
        ("FP8-block 2-D quantize, rowwise + columnwise", 2, 0, True, True, ""),
        ("FP8-block 1-D quantize, compact rowwise + columnwise", 1, 1, True, True, ""),
    ]
    for name, block_dim, layout, rowwise, columnwise, target in cases:
        bufs = _buffers(block_dim, layout, rowwise, columnwise)
        descs = [None if b is None else desc(b) for b in bufs]

        def run(descs=descs, block_dim=block_dim, layout=layout):
            lib.fp8_block_quantize(dx, *descs, block_dim=block_dim, layout=layout, stream=stream())

        ms = time_ms(run)
        moved = sum(b.numel() * b.element_size() for b in bufs if b is not None) + 2 * n
        gbs = moved / ms / 1e6
        table.add(f"{name} {ROWS}x{COLS} bf16", ms, gbs, "GB/s", gbs / copy_gbs, target=target)

    q, s = _buffers(1, 0, True, False)[:2]
    lib.fp8_block_quantize(dx, desc(q), desc(s), None, None, block_dim=1, layout=0, stream=stream())
    y = torch.empty_like(x)
    dq, ds, dy = desc(q), desc(s), desc(y)
    ms = time_ms(lambda: lib.fp8_block_dequantize(dq, ds, dy, 1, 0, False, stream=stream()))
    gbs = (3 * n + s.numel() * 4) / ms / 1e6
    table.add(f"FP8-block 1-D dequantize to bf16 {ROWS}x{COLS}", ms, gbs, "GB/s", gbs / copy_gbs)
