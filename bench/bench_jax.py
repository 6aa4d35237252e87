"""te-jax's FFI ops on the GPU against plain JAX, measured in the same run.

Cases (H200-sized, as bench_core.py): current-scaling FP8 quantize of
32768x4096 BF16, rowwise and rowwise + columnwise, against the same
amax -> scale -> cast written in jax.numpy (jitted; XLA fuses it); the FP8 GEMM
8192^3 (E4M3 x E4M3 -> BF16) against jax.numpy's BF16 matmul and against
XLA's own FP8 dot (jax.lax.dot_general on float8 inputs with scales applied
after, which XLA rewrites to a cuBLASLt FP8 GEMM on Hopper).

Timing: each case is jitted; 5 warm-up calls, then the median over 20 samples
of `calls` back-to-back calls (wall time around block_until_ready; on an idle
GPU the host enqueues ahead, so a sample is the GPU time of `calls` calls plus
one launch latency).

    python bench/bench_jax.py [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

ROWS, COLS, N = 32768, 4096, 8192


def time_ms(fn, *args, warmup=5, samples=20, calls=10) -> float:
    for _ in range(warmup):
        out = fn(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(times)


def jnp_current_scaling(x, columnwise: bool):
    """amax -> scale -> saturating cast, in jax.numpy (the baseline)."""
    amax = jnp.max(jnp.abs(x.astype(jnp.float32)))
    scale = jnp.where(amax > 0, 448.0 / amax, 1.0)
    q = jnp.clip(x.astype(jnp.float32) * scale, -448.0, 448.0).astype(jnp.float8_e4m3fn)
    return (q, q.T) if columnwise else (q,)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", help="write the table as Markdown here")
    args = parser.parse_args(argv)
    if not any(d.platform == "gpu" for d in jax.devices()):
        print("bench_jax: needs JAX with a GPU", file=sys.stderr)
        return 2
    from transformer_engine.jax import cpp_extensions as ext

    rows = []

    def add(case, ms, rate, unit, base_name, base_ms):
        rows.append((case, ms, rate, unit, base_name, base_ms))
        print(f"{case:52s} {ms:8.3f} ms {rate:8.0f} {unit}  {base_ms / ms:5.2f}x vs {base_name} ({base_ms:.3f} ms)")

    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (ROWS, COLS), jnp.bfloat16)
    n = ROWS * COLS
    for columnwise in (False, True):
        ours = jax.jit(lambda x, c=columnwise: ext.quantize_fp8_current_scaling(x, columnwise=c)[:2])
        base = jax.jit(lambda x, c=columnwise: jnp_current_scaling(x, c))
        ms, base_ms = time_ms(ours, x), time_ms(base, x)
        moved = n * (2 + (2 if columnwise else 1))
        label = "rowwise + columnwise" if columnwise else "rowwise"
        add(f"current-scaling quantize {label} {ROWS}x{COLS} bf16", ms, moved / ms / 1e6, "GB/s", "jnp", base_ms)

    a = jax.random.normal(key, (N, N), jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (N, N), jnp.bfloat16)
    qa, _, _, sa_inv, _ = ext.quantize_fp8_current_scaling(a)
    qb, _, _, sb_inv, _ = ext.quantize_fp8_current_scaling(b)
    flops = 2 * N**3
    ours = jax.jit(lambda qa, qb, sa, sb: ext.gemm(qa, qb, transb=True, a_scale_inv=sa, b_scale_inv=sb))
    bf16 = jax.jit(lambda a, b: jnp.dot(a, b.T))
    xla_fp8 = jax.jit(
        lambda qa, qb, sa, sb: (
            jax.lax.dot_general(qa, qb, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * (sa * sb)
        ).astype(jnp.bfloat16)
    )
    ms = time_ms(ours, qa, qb, sa_inv, sb_inv)
    add("FP8 GEMM 8192^3 TN -> bf16", ms, flops / ms / 1e9, "TFLOP/s", "jnp BF16", time_ms(bf16, a, b))
    add(
        "FP8 GEMM 8192^3 TN -> bf16",
        ms,
        flops / ms / 1e9,
        "TFLOP/s",
        "XLA FP8 dot",
        time_ms(xla_fp8, qa, qb, sa_inv, sb_inv),
    )
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("| case | time (ms) | rate | baseline (same run) | speed-up |\n|---|---|---|---|---|\n")
            for case, ms, rate, unit, base_name, base_ms in rows:
                f.write(
                    f"| {case} | {ms:.3f} | {rate:.0f} {unit} | {base_name} {base_ms:.3f} ms | {base_ms / ms:.2f}x |\n"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
