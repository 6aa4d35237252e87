"""NVFP4 kernels on 32768x4096 BF16: amax pass, quantize pass, both, dequantize.

Run alone (`python bench/bench_nvfp4.py`) or from bench_core.py through
`bench_nvfp4(table, copy_gbs)`. Rates count the bytes each kernel must move:
quantize reads 2 B and writes 1/2 B of data plus 1/16 B of scale per element
and direction. Target: rowwise + columnwise quantize (RHT off) >= 60% of the
copy ceiling.
"""

from __future__ import annotations

import sys

import torch
from _timing import COLS, ROWS, Table, copy_ceiling_gbs, time_ms
from torch_desc import stream

import transformer_engine.core as tc

lib = tc.lib


def raw(shape, code, nbytes=None):
    """A uint8 CUDA buffer and its descriptor as a core tensor of `code`."""
    n = nbytes if nbytes is not None else int(torch.tensor(shape).prod())
    t = torch.zeros(n, dtype=torch.uint8, device="cuda")
    return t, lib.TensorDesc(t.data_ptr(), int(code), list(shape), 1, t.device.index or 0)


def bench_nvfp4(table: Table, copy_gbs: float) -> None:
    from transformer_engine.core.dtypes import DType
    from transformer_engine.core.nvfp4 import RHT_SIGN_MASK, scale_shape

    m, k = ROWS, COLS
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dx = lib.TensorDesc(x.data_ptr(), int(DType.kBFloat16), [m, k], 1, x.device.index or 0)
    keep = []  # the buffers behind the descriptors stay alive

    def buf(shape, code, nbytes=None):
        t, d = raw(shape, code, nbytes)
        keep.append(t)
        return d

    amax_r, amax_c = buf([], DType.kFloat32, 4), buf([], DType.kFloat32, 4)
    row, col = buf([m, k], DType.kFloat4E2M1, m * k // 2), buf([k, m], DType.kFloat4E2M1, m * k // 2)
    rs, cs = buf(scale_shape(m, k), DType.kFloat8E4M3), buf(scale_shape(k, m), DType.kFloat8E4M3)
    state = buf([2], DType.kInt64, 16)
    out = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    dout = lib.TensorDesc(out.data_ptr(), int(DType.kBFloat16), [m, k], 1, out.device.index or 0)
    n = m * k

    def amax(rht=False):
        lib.nvfp4_compute_amax(dx, amax_r, amax_c, rht, RHT_SIGN_MASK, stream())

    def quantize(rowwise=True, columnwise=True, **opts):
        lib.nvfp4_quantize(
            dx,
            amax_r if rowwise else None,
            row if rowwise else None,
            rs if rowwise else None,
            amax_c if columnwise else None,
            col if columnwise else None,
            cs if columnwise else None,
            rht_sign_mask=RHT_SIGN_MASK,
            rng_state=state,
            stream=stream(),
            **opts,
        )

    amax()
    per_direction = 0.5 + 1 / 16
    cases = [
        ("amax (rowwise)", lambda: amax(), 2.0, ""),
        ("amax (rowwise + columnwise post-RHT)", lambda: amax(True), 2.0, ""),
        ("quantize rowwise", lambda: quantize(columnwise=False), 2 + per_direction, ""),
        ("quantize rowwise + columnwise", lambda: quantize(), 2 + 2 * per_direction, ">= 60% of copy"),
        ("amax + quantize rowwise + columnwise", lambda: (amax(), quantize()), 4 + 2 * per_direction, ""),
        ("quantize rowwise + columnwise, RHT", lambda: quantize(random_hadamard=True), 2 + 2 * per_direction, ""),
        ("quantize rowwise + columnwise, SR", lambda: quantize(stochastic_rounding=True), 2 + 2 * per_direction, ""),
        ("quantize rowwise + columnwise, 2-D", lambda: quantize(block_2d=True), 2 + 2 * per_direction, ""),
        (
            "dequantize rowwise to bf16",
            lambda: lib.nvfp4_dequantize(row, rs, amax_r, dout, stream()),
            per_direction + 2,
            "",
        ),
    ]
    for name, fn, bytes_per_elem, target in cases:
        ms = time_ms(fn)
        gbs = n * bytes_per_elem / ms / 1e6
        table.add(f"NVFP4 {name} {m}x{k} bf16", ms, gbs, "GB/s", gbs / copy_gbs, target=target)


if __name__ == "__main__":
    if not (torch.cuda.is_available() and tc.built_with_cuda()):
        sys.exit("bench: needs a CUDA GPU and a te-core built with CUDA")
    table = Table()
    bench_nvfp4(table, copy_ceiling_gbs())
    print("\n" + table.markdown())
