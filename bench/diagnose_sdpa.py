"""Which torch SDPA kernel te.DotProductAttention's flash backend gets, and what
the module adds around it (H200 diagnosis for the attention targets).

For the Llama shape (b2 s4096, 32/8 heads, d128, causal, BF16, bshd views as
the module passes them) it times fwd and fwd+bwd of: SDPA with torch's default
choice, SDPA restricted to each backend (cuDNN, FlashAttention-2, efficient),
and te.DotProductAttention; and prints the output's strides (a bshd-contiguous
output makes the module's reshape free).

    python bench/diagnose_sdpa.py
"""

from __future__ import annotations

import contextlib

import torch
from bench_te_pytorch_attention import _time_ms  # (bench/ is on sys.path when run as a script)
from torch.nn.attention import SDPBackend, sdpa_kernel

import transformer_engine.pytorch as te


def main():
    dev = torch.device("cuda")
    b, s, h, hk, d = 2, 4096, 32, 8, 128
    q = torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, hk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, hk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)

    g = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
    print(f"{'variant':34s} {'fwd ms':>8s} {'fwd+bwd ms':>11s}  output strides")
    variants = [("default", None), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION)]
    variants.append(("efficient", SDPBackend.EFFICIENT_ATTENTION))
    for name, backend in variants:
        try:
            ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
            with ctx:
                o = sdpa()
                fwd = _time_ms(sdpa, dev)
                both = _time_ms(lambda: sdpa().backward(g), dev)
            print(f"SDPA {name:29s} {fwd:8.3f} {both:11.3f}  {tuple(o.stride())}")
        except RuntimeError as e:
            print(f"SDPA {name:29s} unavailable: {str(e).splitlines()[0][:80]}")
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hk, qkv_format="bshd", attn_mask_type="causal")
    out = dpa(q, k, v)
    go = torch.randn_like(out)
    fwd = _time_ms(lambda: dpa(q, k, v), dev)
    both = _time_ms(lambda: dpa(q, k, v).backward(go), dev)
    print(f"te.DotProductAttention ({dpa.last_backend:5s})      {fwd:8.3f} {both:11.3f}  {tuple(out.stride())}")
    # thd: 8 packed sequences of 1024 tokens (varlen) against bshd b8 s1024 through the module
    n, L = 8, 1024
    qp = torch.randn(n * L, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    kp = torch.randn(n * L, hk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    vp = torch.randn(n * L, hk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    cu = torch.arange(0, n * L + 1, L, device=dev, dtype=torch.int32)
    thd = te.DotProductAttention(h, d, num_gqa_groups=hk, qkv_format="thd", attn_mask_type="padding_causal")
    bshd = te.DotProductAttention(h, d, num_gqa_groups=hk, qkv_format="bshd", attn_mask_type="causal")
    qb, kb, vb = (t.detach().view(n, L, *t.shape[1:]).requires_grad_() for t in (qp, kp, vp))

    def run_thd():
        return thd(qp, kp, vp, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=L, max_seqlen_kv=L)

    gt = torch.randn_like(run_thd())
    gb = gt.view(n, L, -1)
    rows = [
        ("thd fwd", _time_ms(run_thd, dev), _time_ms(lambda: bshd(qb, kb, vb), dev)),
        (
            "thd fwd+bwd",
            _time_ms(lambda: run_thd().backward(gt), dev),
            _time_ms(lambda: bshd(qb, kb, vb).backward(gb), dev),
        ),
    ]
    from torch.nn.attention.varlen import varlen_attn

    def raw():
        return varlen_attn(qp, kp, vp, cu, cu, L, L, window_size=(-1, 0))

    go = torch.randn_like(raw())
    rows.append(("raw varlen_attn (no masks)", _time_ms(raw, dev), rows[0][2]))
    rows.append(("raw varlen_attn fwd+bwd", _time_ms(lambda: raw().backward(go), dev), rows[1][2]))
    for heads, label in ((hk, "GQA"), (h, "MHA")):
        try:
            kk = kp if heads == hk else kp.repeat_interleave(h // hk, dim=1)
            vv = vp if heads == hk else vp.repeat_interleave(h // hk, dim=1)

            def cudnn(kk=kk, vv=vv):
                return torch.ops.aten._cudnn_attention_forward(qp, kk, vv, None, cu, cu, L, L, True, 0.0, True, False)

            o = cudnn()[0]
            err = (o.float() - raw().float()).abs().max().item()
            rows.append((f"aten cudnn varlen fwd {label} (err {err:.2g})", _time_ms(cudnn, dev), rows[0][2]))
        except RuntimeError as e:
            print(f"aten cudnn varlen {label}: {str(e).splitlines()[0][:100]}")
    print(f"thd backend: {thd.last_backend}")
    for name, a, c in rows:
        print(f"{name:34s} thd {a:8.3f} ms  bshd b8 s1024 {c:8.3f} ms  ratio {a / c:.2f}")


if __name__ == "__main__":
    main()
