"""Block-scaled GEMMs at 8192^3 through te_gemm_block (called from bench_core.py).

* FP8 block scaling, x 1x128 (1-D) times w 128x128 (2-D) as fprop, and 1-D x
  1-D as wgrad, against per-tensor FP8 te_gemm (split accumulator, TN) in the
  same run; the emulated FP8-block path (dequantize to BF16 + BF16 GEMM) too.
* The emulated MXFP8 and NVFP4 GEMMs (native only on compute capability 10.x)
  against BF16 te_gemm: the cost of emulation.
Each row names the path te_gemm_block took. Quantization is not timed.
"""

from __future__ import annotations

import torch
from bench_gemm import CoreGemm
from torch_desc import desc, stream

import transformer_engine.core as tc
from transformer_engine.core.dtypes import DType
from transformer_engine.core.gemm_block import PATHS, SCALING
from transformer_engine.core.nvfp4 import scale_shape as nvfp4_scale_shape

lib = tc.lib
SIZE = 8192


def _raw(shape, code, keep, nbytes=None):
    """A uint8 CUDA buffer seen as a core tensor of `code` (FP4, E8M0: no torch dtype)."""
    n = nbytes if nbytes is not None else int(torch.tensor(shape).prod())
    t = torch.zeros(max(n, 1), dtype=torch.uint8, device="cuda")
    keep.append(t)
    return lib.TensorDesc(t.data_ptr(), int(code), list(shape), 1, t.device.index or 0)


class BlockGemm:
    """One te_gemm_block call with its descriptors and workspace prepared once."""

    def __init__(self, a, b, d, force_emulation=False):
        self.params = lib.GemmBlockParams(a, b, d, force_emulation=force_emulation)
        path, size = lib.gemm_block_plan(self.params)
        self.path = PATHS[path]
        self.workspace_tensor = torch.empty(max(size, 1), dtype=torch.uint8, device="cuda")
        self.workspace = lib.TensorDesc(
            self.workspace_tensor.data_ptr(), int(DType.kByte), [size], 1, self.workspace_tensor.device.index or 0
        )

    def __call__(self):
        lib.gemm_block(self.params, self.workspace, stream())


def _fp8_block(x, block_dim, keep):
    n, k = x.shape
    q = torch.empty(n, k, device="cuda", dtype=torch.float8_e4m3fn)
    shape = tc.fp8_block_scale_shape((n, k), block_dim=block_dim)
    s = torch.empty(shape, device="cuda", dtype=torch.float32)
    keep += [q, s]
    lib.fp8_block_quantize(desc(x), desc(q), desc(s), None, None, block_dim=block_dim, layout=0, stream=stream())
    mode = SCALING["fp8_block_1d" if block_dim == 1 else "fp8_block_2d"]
    return lib.GemmOperandDesc(desc(q), mode, desc(s))


def _mxfp8(x, keep):
    n, k = x.shape
    q = torch.empty(n, k, device="cuda", dtype=torch.float8_e4m3fn)
    keep.append(q)
    s = _raw(tc.mxfp8_scale_shape((n, k)), DType.kFloat8E8M0, keep)
    lib.quantize_mxfp8(desc(x), desc(q), s, None, None, False, True, stream())  # swizzled
    return lib.GemmOperandDesc(desc(q), SCALING["mxfp8"], s, swizzled_scales=True)


def _nvfp4(x, keep):
    n, k = x.shape
    amax = _raw([], DType.kFloat32, keep, 4)
    q = _raw([n, k], DType.kFloat4E2M1, keep, n * k // 2)
    s = _raw(nvfp4_scale_shape(n, k), DType.kFloat8E4M3, keep)
    lib.nvfp4_compute_amax(desc(x), amax, None, stream=stream())
    lib.nvfp4_quantize(desc(x), amax, q, s, None, None, None, stream=stream())
    return lib.GemmOperandDesc(q, SCALING["nvfp4"], s, amax)


def bench_gemm_block(table, time_ms) -> None:
    n = SIZE
    tflops = lambda ms: 2.0 * n**3 / ms / 1e9  # noqa: E731
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    dy = desc(y)
    keep = []

    one = torch.ones((), device="cuda")
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    per_tensor = time_ms(CoreGemm(x8, w8, y, transb=True, a_scale_inv=one, b_scale_inv=one))
    bf16 = time_ms(CoreGemm(x, w, y, transb=True))

    x1, w2, w1 = _fp8_block(x, 1, keep), _fp8_block(w, 2, keep), _fp8_block(w, 1, keep)
    cases = [
        (f"FP8-block GEMM {n}^3 1x128 x 128x128 (fprop)", x1, w2, False),
        (f"FP8-block GEMM {n}^3 1x128 x 1x128 (wgrad)", x1, w1, False),
        (f"FP8-block GEMM {n}^3 1x128 x 128x128, forced emulation", x1, w2, True),
    ]
    for name, a, b, force in cases:
        gemm = BlockGemm(a, b, dy, force_emulation=force)
        ms = time_ms(gemm)
        table.add(
            f"{name} [{gemm.path}]", ms, tflops(ms), "TFLOP/s", per_tensor / ms, "per-tensor FP8 te_gemm", per_tensor
        )

    for name, quantize in (("MXFP8", _mxfp8), ("NVFP4", _nvfp4)):
        gemm = BlockGemm(quantize(x, keep), quantize(w, keep), dy)
        ms = time_ms(gemm)
        table.add(f"{name} GEMM {n}^3 TN [{gemm.path}]", ms, tflops(ms), "TFLOP/s", bf16 / ms, "BF16 te_gemm", bf16)
