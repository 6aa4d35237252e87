"""Attention forward / forward+backward on the GPU against torch SDPA, in one run.

Case (shared/reference/targets.md, "Attention targets"): causal, b2 s4096, 32 query /
8 KV heads, d128, bshd, BF16. Targets: fwd <= 0.60 ms, fwd+bwd <= 1.80 ms. The core's
calls are timed through its nanobind functions on torch buffers (host overhead of the
binding and validation included); torch SDPA on [b, h, s, d] tensors with enable_gqa.
FLOP/s count the causal half: fwd 2 matmuls, fwd+bwd 2 + 5 matmuls of b h s^2/2 d.
Usage (on the GPU machine, te-core built with CUDA): python bench/bench_attention.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _timing import time_ms
from torch_desc import desc, stream

import transformer_engine.core as tc
from transformer_engine.core.attention import BACKENDS

lib = tc.lib
B, S, H, HK, D = 2, 4096, 32, 8, 128
TARGET_FWD, TARGET_FWD_BWD = 0.60, 1.80


def core_calls():
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, S, HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    o, d_o = torch.empty_like(q), torch.randn_like(q)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kw = dict(qkv_format=0, mask_type=2, scale=D**-0.5)
    dq_, dk_, dv_ = desc(q), desc(k), desc(v)
    backend = BACKENDS[lib.attention_backend(dq_, dk_, dv_, **kw)]
    ws_f = torch.empty(max(lib.attention_fwd_workspace_size(dq_, dk_, dv_, **kw), 1), device="cuda", dtype=torch.uint8)
    d_o_, o_, lse_ = desc(d_o), desc(o), desc(lse)
    ws_b = torch.empty(max(lib.attention_bwd_workspace_size(dq_, dk_, dv_, **kw), 1), device="cuda", dtype=torch.uint8)
    wf, wb, g = desc(ws_f), desc(ws_b), (desc(dq), desc(dk), desc(dv))

    def fwd():
        lib.attention_fwd(dq_, dk_, dv_, o_, lse_, **kw, workspace=wf, stream=stream())

    def fwd_bwd():
        fwd()
        lib.attention_bwd(dq_, dk_, dv_, o_, d_o_, lse_, *g, **kw, workspace=wb, stream=stream())

    return backend, fwd, fwd_bwd


def torch_calls():
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, HK, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    d_o = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(d_o)

    return fwd, fwd_bwd


def main() -> int:
    backend, core_fwd, core_fb = core_calls()
    t_fwd, t_fb = torch_calls()
    flop_half = B * H * S * S / 2 * D * 2  # one causal matmul
    rows = [
        ("fwd", time_ms(core_fwd), time_ms(t_fwd), 2 * flop_half, TARGET_FWD),
        ("fwd+bwd", time_ms(core_fb), time_ms(t_fb), 7 * flop_half, TARGET_FWD_BWD),
    ]
    print(f"attention causal b{B} s{S} h{H} hk{HK} d{D} bshd bf16; core backend: {backend}; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")  # fmt: skip
    print(f"{'case':<9}{'core ms':>9}{'TFLOP/s':>9}{'SDPA ms':>9}{'target':>8}  met")
    for case, ms, base, flop, target in rows:
        met = "yes" if ms <= target else "NO"
        print(f"{case:<9}{ms:>9.3f}{flop / ms / 1e9:>9.0f}{base:>9.3f}{target:>8.2f}  {met}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
