"""Benchmarks of the activation kernels (called from bench_core.py, or alone).

SwiGLU of the reference's LLM shape, [8192, 2 x 14336] BF16, forward and
backward with the fused outputs, against torch eager (F.silu(a) * b and its
autograd backward) measured in the same run. Rates count the bytes each kernel
must move (inputs read once, outputs written once).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from _timing import Table, copy_ceiling_gbs, time_ms
from torch_desc import desc, stream

import transformer_engine.core as tc

lib = tc.lib
ROWS, HIDDEN = 8192, 14336
SWIGLU = tc.ACTIVATIONS.index("swiglu")
GELU = tc.ACTIVATIONS.index("gelu")


def bench_activation(table, time_ms, copy_gbs: float) -> None:
    x = torch.randn(ROWS, 2 * HIDDEN, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(ROWS, HIDDEN, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(ROWS, HIDDEN, device="cuda", dtype=torch.bfloat16)
    y8 = torch.empty(ROWS, HIDDEN, device="cuda", dtype=torch.float8_e4m3fn)
    y8t = torch.empty(HIDDEN, ROWS, device="cuda", dtype=torch.float8_e4m3fn)
    dx = torch.empty_like(x)
    dx8 = torch.empty(ROWS, 2 * HIDDEN, device="cuda", dtype=torch.float8_e5m2)
    dx8t = torch.empty(2 * HIDDEN, ROWS, device="cuda", dtype=torch.float8_e5m2)
    dbias = torch.empty(2 * HIDDEN, device="cuda", dtype=torch.bfloat16)
    scale, scale_inv, amax = (torch.ones((), device="cuda") for _ in range(3))
    ws = torch.empty(lib.activation_bwd_workspace_size(desc(x), True), device="cuda", dtype=torch.uint8)
    d = {
        name: desc(t)
        for name, t in dict(
            x=x, g=g, y=y, y8=y8, y8t=y8t, dx=dx, dx8=dx8, dx8t=dx8t, dbias=dbias, s=scale, si=scale_inv, a=amax, ws=ws
        ).items()
    }
    s = stream()
    n = ROWS * HIDDEN  # output elements of the forward

    xa, xb = x[:, :HIDDEN], x[:, HIDDEN:]
    torch_fwd_ms = time_ms(lambda: F.silu(xa) * xb)
    xr = x.detach().requires_grad_()

    def torch_bwd():
        out = F.silu(xr[:, :HIDDEN]) * xr[:, HIDDEN:]
        (grad,) = torch.autograd.grad(out, xr, g)
        return grad.sum(0)  # dbias

    torch_bwd_ms = time_ms(torch_bwd)
    cases = [
        (
            "swiglu fwd -> bf16",
            lambda: lib.activation_fwd(SWIGLU, d["x"], d["y"], None, None, None, None, stream=s),
            4 + 2,
            ("torch eager silu(a)*b", torch_fwd_ms),
            ">= 85% of copy",
        ),
        (
            "swiglu fwd -> fp8 e4m3 (+amax)",
            lambda: lib.activation_fwd(SWIGLU, d["x"], d["y8"], None, d["s"], d["si"], d["a"], stream=s),
            4 + 1,
            ("torch eager silu(a)*b", torch_fwd_ms),
            "",
        ),
        (
            "swiglu fwd -> fp8 e4m3 rowwise + columnwise",
            lambda: lib.activation_fwd(SWIGLU, d["x"], d["y8"], d["y8t"], d["s"], d["si"], d["a"], stream=s),
            4 + 2,
            ("", None),
            "",
        ),
        (
            "swiglu bwd -> bf16 + dbias",
            lambda: lib.activation_bwd(
                SWIGLU, d["g"], d["x"], d["dx"], None, None, None, None, d["dbias"], d["ws"], stream=s
            ),
            2 + 4 + 4,
            ("torch eager autograd + sum", torch_bwd_ms),
            "",
        ),
        (
            "swiglu bwd -> fp8 e5m2 rowwise + columnwise + dbias",
            lambda: lib.activation_bwd(
                SWIGLU, d["g"], d["x"], d["dx8"], d["dx8t"], d["s"], d["si"], d["a"], d["dbias"], d["ws"], stream=s
            ),
            2 + 4 + 4,
            ("torch eager autograd + sum", torch_bwd_ms),
            "",
        ),
        (
            "gelu fwd -> bf16 (on the 8192 x 28672 input)",
            lambda: lib.activation_fwd(GELU, d["x"], d["dx"], None, None, None, None, stream=s),
            2 * (2 + 2),
            ("", None),
            "",
        ),
    ]
    for name, fn, bytes_per_elem, (base_name, base_ms), target in cases:
        ms = time_ms(fn)
        gbs = n * bytes_per_elem / ms / 1e6
        table.add(f"{name} {ROWS}x{2 * HIDDEN} bf16", ms, gbs, "GB/s", gbs / copy_gbs, base_name, base_ms, target)


if __name__ == "__main__":
    if not torch.cuda.is_available() or not tc.built_with_cuda():
        print("bench: needs a CUDA GPU and a te-core built with CUDA", file=sys.stderr)
        sys.exit(2)
    table = Table()
    ceiling = copy_ceiling_gbs()
    print(f"copy ceiling: {ceiling:.0f} GB/s")
    bench_activation(table, time_ms, ceiling)
    print(table.markdown())
