"""Train a small two-layer MLP in JAX with te-jax's FP8 dense, on the CPU or a GPU.

The model is y = dense(gelu(dense(x, W1)), W2) fitted to a fixed random teacher
network by mean squared error with plain SGD, jitted. It runs once per recipe:
high precision (no quantizer set), DelayedScaling and Float8CurrentScaling (both
HYBRID: E4M3 forward, E5M2 gradients). Every GEMM of an FP8 run, forward, dgrad
and wgrad, runs on FP8 operands through te-core (the CPU backend emulates the
FP8 numerics bit for bit, a GPU runs them on its tensor cores). Prints the loss
curve of each run; the FP8 runs should track the high-precision one.
With --model layernorm_mlp the student is one fused te-jax op instead,
layernorm_mlp(x) = dense(gelu(dense(layernorm(x), W1)), W2) (the norm writing
FC1's FP8 input, the activation FC2's), fitted to the same teacher.

    python examples/jax_dense_demo.py [--steps 200] [--model dense|layernorm_mlp]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import transformer_engine.jax as te_jax
from transformer_engine.common import recipe
from transformer_engine.jax.quantize import QuantizerFactory

TOKENS, D_IN, D_HIDDEN, D_OUT = 256, 64, 128, 32  # (FP8 GEMMs take multiples of 16)


def init(key, scale=0.1):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (D_IN, D_HIDDEN)) * scale,
        "b1": jnp.zeros((D_HIDDEN,)),
        "w2": jax.random.normal(k2, (D_HIDDEN, D_OUT)) * scale,
        "b2": jnp.zeros((D_OUT,)),
    }


def forward(params, quantizers, x, model="dense"):
    if model == "layernorm_mlp":
        w1 = params["w1"].reshape(D_IN, 1, D_HIDDEN)  # [hidden, ACT_DIM = 1, intermediate]
        kernels, biases = [w1, params["w2"]], [params["b1"].reshape(1, D_HIDDEN), params["b2"]]
        gamma, beta = params["gamma"], params["beta"]
        return te_jax.layernorm_mlp.layernorm_mlp(
            x, gamma, beta, kernels, biases, "layernorm", quantizer_sets=quantizers
        )
    h = te_jax.dense.dense(x, params["w1"], params["b1"], quantizer_set=quantizers[0])
    return te_jax.dense.dense(jax.nn.gelu(h), params["w2"], params["b2"], quantizer_set=quantizers[1])


def train(fp8_recipe, steps: int, lr: float = 0.05, model: str = "dense") -> list[float]:
    params = init(jax.random.PRNGKey(0))
    if model == "layernorm_mlp":
        params |= {"gamma": jnp.ones((D_IN,)), "beta": jnp.zeros((D_IN,))}
    teacher = init(jax.random.PRNGKey(1), scale=0.3)
    x = jax.random.normal(jax.random.PRNGKey(2), (TOKENS, D_IN))
    target = _teacher_output(teacher, x)
    # One quantizer set per dense layer (a set carries that layer's delayed-scaling state).
    quantizers = tuple(QuantizerFactory.create_set(fp8_recipe) for _ in range(2))

    def loss_fn(params, quantizers):
        return jnp.mean((forward(params, quantizers, x, model) - target) ** 2)

    @jax.jit
    def step(params, quantizers):
        loss, (grads, quantizers) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, quantizers)
        params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
        return params, quantizers, loss

    losses = []
    for _ in range(steps):
        params, quantizers, loss = step(params, quantizers)
        losses.append(float(loss))
    return losses


def _teacher_output(teacher, x):
    """The teacher in plain jax.numpy (float32)."""
    return jax.nn.gelu(x @ teacher["w1"] + teacher["b1"]) @ teacher["w2"] + teacher["b2"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--model", choices=["dense", "layernorm_mlp"], default="dense")
    args = parser.parse_args(argv)
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}")
    runs = {
        "high precision": None,
        "DelayedScaling": recipe.DelayedScaling(amax_history_len=16),
        "Float8CurrentScaling": recipe.Float8CurrentScaling(),
    }
    curves = {name: train(r, args.steps, model=args.model) for name, r in runs.items()}
    marks = sorted({0, args.steps // 4, args.steps // 2, args.steps - 1})
    print(f"{'run':22s}" + "".join(f"  step {m:>4d}" for m in marks))
    for name, losses in curves.items():
        print(f"{name:22s}" + "".join(f"  {losses[m]:9.5f}" for m in marks))


if __name__ == "__main__":
    main()
