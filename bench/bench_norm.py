"""LayerNorm / RMSNorm CUDA kernels against torch at 32768 x 4096 BF16 (BF16 gamma).

Targets (shared/reference/targets.md, H200): LayerNorm fwd <= 0.22 ms, RMSNorm fwd <=
0.20 ms, LayerNorm fwd+bwd <= 0.85 ms. Floor: forward moves 2 x 256 MiB, backward 3 x 256
MiB. Usage (on the GPU machine, te-core built with CUDA): python bench/bench_norm.py
"""

from __future__ import annotations

import torch
from _timing import time_ms
from torch_desc import desc, stream

import transformer_engine.core as tc

lib = tc.lib
ROWS, COLS = 32768, 4096


def main() -> int:
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    dz = torch.randn_like(x)
    gamma = torch.randn(COLS, device="cuda", dtype=torch.bfloat16)
    beta = torch.randn_like(gamma)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    mu = torch.empty(ROWS, device="cuda", dtype=torch.float32)
    rsigma = torch.empty_like(mu)
    dgamma, dbeta = torch.empty_like(gamma), torch.empty_like(gamma)
    ws = torch.empty(lib.layernorm_bwd_workspace_size(desc(x)), device="cuda", dtype=torch.uint8)
    ws_rms = torch.empty(lib.rmsnorm_bwd_workspace_size(desc(x)), device="cuda", dtype=torch.uint8)
    d = {
        k: desc(v)
        for k, v in dict(
            x=x, dz=dz, g=gamma, b=beta, y=y, dx=dx, mu=mu, rs=rsigma, dg=dgamma, db=dbeta, ws=ws, wsr=ws_rms
        ).items()
    }

    def ln_fwd():
        lib.layernorm_fwd(d["x"], d["g"], d["b"], 1e-5, False, d["y"], None, None, None, d["mu"], d["rs"], stream())

    def ln_bwd():
        lib.layernorm_bwd(
            d["dz"], d["x"], d["mu"], d["rs"], d["g"], False, d["dx"], d["dg"], d["db"], d["ws"], stream()
        )

    def rms_fwd():
        lib.rmsnorm_fwd(d["x"], d["g"], 1e-5, False, d["y"], None, None, None, d["rs"], stream())

    def rms_bwd():
        lib.rmsnorm_bwd(d["dz"], d["x"], d["rs"], d["g"], False, d["dx"], d["dg"], d["wsr"], stream())

    ln = torch.nn.LayerNorm(COLS, device="cuda", dtype=torch.bfloat16)
    rms = torch.nn.RMSNorm(COLS, device="cuda", dtype=torch.bfloat16)
    xt = x.clone().requires_grad_()

    def torch_fwd_bwd(mod):
        def run():
            mod(xt).backward(dz)

        return run

    tensor_bytes = 2 * ROWS * COLS  # one BF16 [ROWS, COLS] tensor
    rows = [
        ("layernorm fwd", ln_fwd, lambda: ln(x), 2 * tensor_bytes, 0.22),
        ("rmsnorm fwd", rms_fwd, lambda: rms(x), 2 * tensor_bytes, 0.20),
        ("layernorm fwd+bwd", lambda: (ln_fwd(), ln_bwd()), torch_fwd_bwd(ln), 5 * tensor_bytes, 0.85),
        ("rmsnorm fwd+bwd", lambda: (rms_fwd(), rms_bwd()), torch_fwd_bwd(rms), 5 * tensor_bytes, None),
    ]
    print(f"{'op':20s} {'te ms':>8s} {'GB/s':>8s} {'torch ms':>9s} {'target':>7s}")
    for name, ours, theirs, nbytes, target in rows:
        t = time_ms(ours)
        t_ref = time_ms(theirs)
        mark = "" if target is None else (f"{target:.2f}" + (" ok" if t <= target else " MISS"))
        print(f"{name:20s} {t:8.3f} {nbytes / t / 1e6:8.0f} {t_ref:9.3f} {mark:>7s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
