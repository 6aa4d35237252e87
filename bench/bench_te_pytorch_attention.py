"""te.DotProductAttention and te.TransformerLayer against torch in the same run (issue 12 targets).

Cases (targets.md "Attention targets"):
- DotProductAttention causal, b2 s4096, 32 query / 8 KV heads, d128, bshd, BF16: fwd and
  fwd+bwd, next to torch.nn.functional.scaled_dot_product_attention (enable_gqa) on the
  same tensors; which te backend ran is printed (fused = te-core's op).
- thd: 8 packed sequences of 1024 tokens against the same work in bshd b8 s1024.
- TransformerLayer Llama-3-8B-like (hidden 4096, FFN 14336 swiglu, RMSNorm, 32/8 GQA,
  causal, s4096 b2, no bias) fwd+bwd in BF16 and under DelayedScaling / Float8CurrentScaling
  (the linears in FP8, attention in BF16), with the step's peak memory.
Times are CUDA-event medians of single iterations after warm-up (host time on the CPU).
FP8 attention (fp8_dpa) is not yet supported: those rows print "n/a".

    python bench/bench_te_pytorch_attention.py            # the H200 sizes
    python bench/bench_te_pytorch_attention.py --small --device cpu   # smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe


def _time_ms(fn, device, reps=10, warmup=3):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _attention(args, device, dtype):
    b, s, h, hk, d = (2, 256, 4, 2, 32) if args.small else (2, 4096, 32, 8, 128)
    q = torch.randn(b, s, h, d, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(b, s, hk, d, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(b, s, hk, d, device=device, dtype=dtype, requires_grad=True)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hk, qkv_format="bshd", attn_mask_type="causal")
    out = dpa(q, k, v)
    g = torch.randn_like(out)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)

    gt = torch.randn_like(sdpa())
    rows = [
        ("DPA bf16 fwd", _time_ms(lambda: dpa(q, k, v), device), _time_ms(sdpa, device)),
        (
            "DPA bf16 fwd+bwd",
            _time_ms(lambda: dpa(q, k, v).backward(g), device),
            _time_ms(lambda: sdpa().backward(gt), device),
        ),
    ]
    print(f"attention backend: {dpa.last_backend}")
    return rows


def _thd(args, device, dtype):
    n, s, h, d = (4, 128, 4, 32) if args.small else (8, 1024, 32, 128)
    dpa = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
    q, k, v = (torch.randn(n * s, h, d, device=device, dtype=dtype) for _ in range(3))
    cu = torch.arange(0, (n + 1) * s, s, dtype=torch.int32, device=device)
    thd = _time_ms(lambda: dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s), device)
    dense = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    qb, kb, vb = (t.view(n, s, h, d) for t in (q, k, v))
    return [("DPA thd fwd (vs bshd)", thd, _time_ms(lambda: dense(qb, kb, vb), device))]


def _layer(args, device, dtype):
    hidden, ffn, heads, groups, s, b = (256, 512, 4, 2, 128, 2) if args.small else (4096, 14336, 32, 8, 4096, 2)
    layer = te.TransformerLayer(
        hidden,
        ffn,
        heads,
        num_gqa_groups=groups,
        normalization="RMSNorm",
        activation="swiglu",
        bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=dtype,
        device=device,
    )
    x = torch.randn(s, b, hidden, device=device, dtype=dtype, requires_grad=True)
    rows = []
    for name, rec in (("bf16", None), ("delayed", recipe.DelayedScaling()), ("current", recipe.Float8CurrentScaling())):

        def step(rec=rec):
            x.grad = None
            layer.zero_grad(set_to_none=True)
            with te.autocast(enabled=rec is not None, recipe=rec):
                y = layer(x)
            y.sum().backward()

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ms = _time_ms(step, device, reps=5)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        rows.append((f"TransformerLayer {name} fwd+bwd (peak {peak:.2f} GiB)", ms, None))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="small sizes (a smoke test)")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16
    rows = _attention(args, device, dtype) + _thd(args, device, dtype) + _layer(args, device, dtype)
    rows.append(("DPA fp8 (delayed / current)", None, None))
    print(f"{'case':58} {'te ms':>9} {'torch ms':>9}")
    for name, ours, ref in rows:
        fmt = lambda t: "n/a" if t is None else f"{t:.3f}"  # noqa: E731
        print(f"{name:58} {fmt(ours):>9} {fmt(ref):>9}")


if __name__ == "__main__":
    main()
