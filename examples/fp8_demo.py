"""FP8 on a real-looking layer, on the CPU: each per-tensor recipe, the three GEMMs of a Linear.

For a Linear y = x W^T with activations that have outlier channels (as LayerNorm outputs
do), a small-init weight and a small output gradient, this quantizes every operand the way
each recipe does (E4M3 forward; E5M2 gradients under HYBRID), runs the forward (fprop),
data-gradient (dgrad) and weight-gradient (wgrad) GEMMs in FP8 with FP32 accumulation, and
prints the relative error of each against FP32 — next to the error of plain BF16.

Delayed scaling is run for a few steps first, so its scale comes from the amax history of
earlier steps, exactly as during training.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

import transformer_engine.core as tc
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format


def rel_err(approx: np.ndarray, exact: np.ndarray) -> float:
    return float(np.linalg.norm(approx.astype(np.float64) - exact) / np.linalg.norm(exact))


def make_layer(rng, tokens: int, d_in: int, d_out: int):
    x = rng.standard_normal((tokens, d_in)).astype(np.float32)
    x[:, rng.choice(d_in, 8, replace=False)] *= 20.0  # outlier channels
    w = (rng.standard_normal((d_out, d_in)) * 0.02).astype(np.float32)
    dy = (rng.standard_normal((tokens, d_out)) * 1e-4).astype(np.float32)
    return x, w, dy


def formats_of(recipe) -> tuple[str, str]:
    """(forward, backward) FP8 formats of a recipe."""
    if recipe.fp8_format == Format.HYBRID:
        return "e4m3", "e5m2"
    name = "e4m3" if recipe.fp8_format == Format.E4M3 else "e5m2"
    return name, name


class DelayedScaler:
    """One scale + amax history per tensor, updated after every step (te/recipe.h)."""

    def __init__(self, recipe: DelayedScaling, fmt: str):
        self.recipe, self.fmt = recipe, fmt
        self.history = np.zeros((recipe.amax_history_len, 1), np.float32)
        self.scale = np.ones(1, np.float32)

    def quantize(self, t: np.ndarray, columnwise=False) -> tc.Fp8Tensor:
        q = tc.quantize_fp8(t, self.scale[0], self.fmt, columnwise=columnwise, amax=self.history[0, 0])
        self.history[0, 0] = q.amax
        return q

    def update(self) -> None:
        tc.delayed_scaling_update(
            [self.history],
            [self.scale],
            amax_compute_algo=self.recipe.amax_compute_algo,
            fp8_dtype=self.fmt,
            margin=self.recipe.margin,
        )


def quantize_all(recipe, x, w, dy, rng, steps: int):
    fwd, bwd = formats_of(recipe)
    if isinstance(recipe, DelayedScaling):
        scalers = {"x": DelayedScaler(recipe, fwd), "w": DelayedScaler(recipe, fwd), "dy": DelayedScaler(recipe, bwd)}
        for _ in range(steps):  # earlier training steps: slightly different tensors
            drift = np.float32(1.0 + 0.02 * rng.standard_normal())
            for name, t in (("x", x), ("w", w), ("dy", dy)):
                scalers[name].quantize(t * drift)
                scalers[name].update()
        return {name: scalers[name].quantize(t, columnwise=True) for name, t in (("x", x), ("w", w), ("dy", dy))}
    opts = dict(columnwise=True, force_pow_2_scales=recipe.use_power_2_scales)
    return {
        "x": tc.quantize_fp8_current_scaling(x, fwd, **opts),
        "w": tc.quantize_fp8_current_scaling(w, fwd, **opts),
        "dy": tc.quantize_fp8_current_scaling(dy, bwd, **opts),
    }


def fp8_gemms(q) -> dict:
    """fprop y = x W^T, dgrad dx = dy W, wgrad dW = dy^T x, all in FP8 (TN inside the core)."""
    x, w, dy = q["x"], q["w"], q["dy"]
    return {
        "fprop  y = x W^T": tc.gemm(
            x.rowwise, w.rowwise, transb=True, a_scale_inv=x.scale_inv, b_scale_inv=w.scale_inv
        ).out,
        "dgrad dx = dy W": tc.gemm(dy.rowwise, w.rowwise, a_scale_inv=dy.scale_inv, b_scale_inv=w.scale_inv).out,
        "wgrad dW = dy^T x": tc.gemm(
            dy.columnwise, x.columnwise, transb=True, a_scale_inv=dy.scale_inv, b_scale_inv=x.scale_inv
        ).out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--d-in", type=int, default=1024)
    parser.add_argument("--d-out", type=int, default=768)
    parser.add_argument("--steps", type=int, default=8, help="delayed-scaling warm-up steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    x, w, dy = make_layer(rng, args.tokens, args.d_in, args.d_out)
    exact = {
        "fprop  y = x W^T": x.astype(np.float64) @ w.T.astype(np.float64),
        "dgrad dx = dy W": dy.astype(np.float64) @ w.astype(np.float64),
        "wgrad dW = dy^T x": dy.T.astype(np.float64) @ x.astype(np.float64),
    }
    bf16 = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
    bf16_out = {
        "fprop  y = x W^T": bf16(x) @ bf16(w).T,
        "dgrad dx = dy W": bf16(dy) @ bf16(w),
        "wgrad dW = dy^T x": bf16(dy).T @ bf16(x),
    }
    print(
        f"Linear {args.d_in}->{args.d_out}, {args.tokens} tokens, te-core {tc.__version__} "
        f"({'CUDA' if tc.built_with_cuda() else 'CPU'} build; this demo runs the CPU backend)\n"
    )
    recipes = [DelayedScaling(amax_history_len=16, amax_compute_algo="max"), Float8CurrentScaling()]
    print(f"{'recipe':22s} {'tensor':5s} {'format':6s} {'scale':>12s} {'quantization error':>19s}")
    results = {}
    for recipe in recipes:
        name = type(recipe).__name__
        q = quantize_all(recipe, x, w, dy, rng, args.steps)
        fwd, bwd = formats_of(recipe)
        for tensor, original, fmt in (("x", x, fwd), ("w", w, fwd), ("dy", dy, bwd)):
            back = tc.dequantize_fp8(q[tensor].rowwise, q[tensor].scale_inv)
            print(f"{name:22s} {tensor:5s} {fmt:6s} {float(q[tensor].scale):12.4g} {rel_err(back, original):19.2e}")
        results[name] = fp8_gemms(q)
    print(f"\n{'GEMM':20s} {'BF16 error':>11s}" + "".join(f" {n + ' error':>26s}" for n in results))
    for gemm_name, reference in exact.items():
        row = f"{gemm_name:20s} {rel_err(bf16_out[gemm_name], reference):11.2e}"
        row += "".join(f" {rel_err(r[gemm_name], reference):26.2e}" for r in results.values())
        print(row)
    print(
        "\nErrors are ||approx - exact|| / ||exact|| against float64. FP8 keeps 3 (E4M3) or 2 (E5M2)"
        " mantissa bits, BF16 keeps 8: FP8 errors of a few 1e-2 are expected; the scales keep every"
        " tensor inside the FP8 range, so nothing overflows or flushes to zero."
    )


if __name__ == "__main__":
    main()
