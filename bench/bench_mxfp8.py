"""MXFP8 benchmarks (called by bench_core.py): quantize and dequantize 32768x4096 BF16.

Bytes per element counted: BF16 read (2), FP8 written per direction (1), E8M0
scales per direction (1/32). Target: rowwise + columnwise >= 70% of the copy
ceiling.
"""

from __future__ import annotations

import torch
from torch_desc import desc, stream

import transformer_engine.core as tc

lib = tc.lib
ROWS, COLS = 32768, 4096


def _e8m0_desc(t: torch.Tensor) -> lib.TensorDesc:
    """Descriptor of a uint8 tensor holding E8M0 scales (torch has no E8M0 code in torch_desc)."""
    return lib.TensorDesc(t.data_ptr(), int(tc.DType.kFloat8E8M0), list(t.shape), 1, t.device.index or 0)


def bench_mxfp8(table, time_ms, copy_gbs: float) -> None:
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    row = torch.empty(ROWS, COLS, device="cuda", dtype=torch.float8_e4m3fn)
    col = torch.empty(ROWS, COLS, device="cuda", dtype=torch.float8_e4m3fn)
    row_s = torch.empty(tc.mxfp8_scale_shape((ROWS, COLS)), dtype=torch.uint8, device="cuda")
    col_s = torch.empty(tc.mxfp8_scale_shape((ROWS, COLS), columnwise=True), dtype=torch.uint8, device="cuda")
    drow_s, dcol_s = _e8m0_desc(row_s), _e8m0_desc(col_s)  # the tensors stay alive in this frame
    back = torch.empty_like(x)
    dx, drow, dcol, dback = desc(x), desc(row), desc(col), desc(back)
    n = x.numel()
    cases = [
        (
            "MXFP8 quantize, rowwise",
            lambda: lib.quantize_mxfp8(dx, drow, drow_s, None, None, False, False, stream()),
            2 + 1 + 1 / 32,
            "",
        ),
        (
            "MXFP8 quantize, columnwise",
            lambda: lib.quantize_mxfp8(dx, None, None, dcol, dcol_s, False, False, stream()),
            2 + 1 + 1 / 32,
            "",
        ),
        (
            "MXFP8 quantize, rowwise + columnwise",
            lambda: lib.quantize_mxfp8(dx, drow, drow_s, dcol, dcol_s, False, False, stream()),
            2 + 2 + 2 / 32,
            ">= 70% of copy",
        ),
        (
            "MXFP8 quantize, rowwise + columnwise, swizzled scales",
            lambda: lib.quantize_mxfp8(dx, drow, drow_s, dcol, dcol_s, False, True, stream()),
            2 + 2 + 2 / 32,
            "",
        ),
        (
            "MXFP8 quantize, 2-D 32x32 blocks, both",
            lambda: lib.quantize_mxfp8(dx, drow, drow_s, dcol, dcol_s, True, False, stream()),
            2 + 2 + 2 / 32,
            "",
        ),
        (
            "MXFP8 dequantize rowwise -> bf16",
            lambda: lib.dequantize_mxfp8(drow, drow_s, dback, False, False, stream()),
            1 + 1 / 32 + 2,
            "",
        ),
    ]
    for name, fn, bytes_per_elem, target in cases:
        ms = time_ms(fn)
        gbs = n * bytes_per_elem / ms / 1e6
        table.add(f"{name} {ROWS}x{COLS} bf16", ms, gbs, "GB/s", gbs / copy_gbs, target=target)
