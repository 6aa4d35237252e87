"""The main job: a small GPT trained with Transformer Engine under BF16 and every FP8/FP4 recipe.

    python examples/gpt_demo.py [--steps N] [--recipes BF16,DelayedScaling,...] [--device cpu|cuda]
                                [--size auto|small|large] [--out DIR]

A byte-level GPT (token embedding, N x te.TransformerLayer with RoPE, RMSNorm, SwiGLU and causal
GQA attention, a final te.RMSNorm, an LM head through te.Linear) learns the Python documentation
that ships with Python (pydoc_data.topics), once per recipe from the same seed, initial weights
and batches. A tqdm bar shows the loss and tokens/s; at the end DIR (default gpt_demo_out/) holds
loss_curves.png, report.md, report.html (final and validation loss per recipe and their gaps to
BF16, tokens/s, peak memory, a text sample generated with the KV cache) and results.json.

On the CPU (the default; te-core's CPU backend, the same quantized bytes a GPU produces) a small
config runs all six recipes in a few minutes on 2 cores, each recipe in its own forked process so
that its peak RSS is its own. With --device cuda a larger config is used (8 layers, hidden 512,
sequence 512).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import platform
import resource
import sys
import time
import traceback
from pathlib import Path

import torch
from gpt import report
from gpt.data import Batches, corpus
from gpt.model import LARGE, SMALL
from gpt.train import RECIPES, current_rss_mib, train


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps per recipe (default: the config's)")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated, from: " + ", ".join(RECIPES))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--size", choices=["auto", "small", "large"], default="auto", help="model config (auto: large on cuda)"
    )
    parser.add_argument("--out", type=Path, default=Path("gpt_demo_out"))
    args = parser.parse_args(argv)
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown or not args.recipes:
        parser.error(f"--recipes: unknown {unknown}; choose from {', '.join(RECIPES)}")
    if args.steps is not None and args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is left out of tokens/s)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    return args


def safe_train(name, cfg, data, device) -> dict:
    """One recipe; a failure becomes a row of the report (and a non-zero exit), not a crash."""
    try:
        return train(name, cfg, data, device)
    except Exception as exc:  # noqa: BLE001 - reported with its traceback, and the exit code says so
        traceback.print_exc()
        return dict(name=name, error=f"{type(exc).__name__}: {exc}")


def _child(conn, name, cfg, data) -> None:
    torch.set_num_threads(1)  # torch's spinning OpenMP workers would compete with te-core's threads
    start = current_rss_mib()
    conn.send(dict(safe_train(name, cfg, data, torch.device("cpu")), start_mib=start))
    conn.close()


def run_cpu(name, cfg, data) -> dict:
    """A forked process per recipe: its ru_maxrss is then this recipe's peak (plus the imports)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        torch.set_num_threads(1)
        return safe_train(name, cfg, data, torch.device("cpu"))
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, name, cfg, data))
    proc.start()
    child.close()
    try:
        result = parent.recv()
    except EOFError:
        result = dict(name=name, error=f"the worker process died (exit code {proc.join() or proc.exitcode})")
    proc.join()
    return result


def run_cuda(name, cfg, data) -> dict:
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return safe_train(name, cfg, data, device)


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the recipes' workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def describe(cfg, device, text_source, args) -> dict:
    where = (
        torch.cuda.get_device_name() if device == "cuda" else f"{platform.processor() or 'CPU'}, {os.cpu_count()} cores"
    )
    model = (
        f"{cfg.layers} x te.TransformerLayer, hidden {cfg.hidden}, {cfg.heads} heads / {cfg.groups} KV groups "
        f"(head dim {cfg.head_dim}), SwiGLU ffn {cfg.ffn}, RoPE, RMSNorm, byte vocabulary 256"
    )
    training = (
        f"{cfg.steps} steps of {cfg.batch} x {cfg.seq} tokens, AdamW lr {cfg.lr} (warm-up + cosine), "
        "grad clip 1.0, seed 0"
    )
    return dict(
        title="A small GPT trained with Transformer Engine under each recipe",
        facts={"device": f"{device} ({where})", "model": model, "training": training, "corpus": text_source},
        notes=(
            "Final train loss: mean over the last 10% of the steps. Val loss: held-out last 10% of the corpus, "
            "evaluated under the same recipe. Every run uses BF16 activations (torch.autocast) and FP32 master "
            "weights; the FP8/FP4 recipes quantize the GEMM operands on top. tokens/s leaves out the first step. "
            "Peak memory: "
            + (
                "torch.cuda.max_memory_allocated per recipe."
                if device == "cuda"
                else "peak resident set size (getrusage ru_maxrss) of the forked process that ran the recipe; "
                "in parentheses its growth over the RSS that process started with (torch and te already imported)."
            )
        ),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = {"small": SMALL, "large": LARGE}.get(args.size, LARGE if args.device == "cuda" else SMALL)
    if args.steps:
        cfg = dataclasses.replace(cfg, steps=args.steps)
    cfg.check()
    text, source = corpus()
    data = Batches(text, cfg.seq, cfg.batch, cfg.steps)
    meta = describe(cfg, args.device, f"{source}, {len(text):,} bytes", args)
    print(f"{meta['facts']['model']}\n{meta['facts']['training']}\ncorpus: {meta['facts']['corpus']}", flush=True)
    start, cpu_start = time.perf_counter(), cpu_seconds()
    run = run_cuda if args.device == "cuda" else run_cpu
    results = [run(name, cfg, data) for name in args.recipes]
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    meta["facts"]["run time"] = f"{wall:.0f} s wall, {cpu:.0f} s CPU (all recipes)"
    paths = report.write(results, meta, args.out)
    print("\n" + "\n".join(" | ".join(row) for row in [report.HEADER, *report.rows(results)]))
    print(f"\n{meta['facts']['run time']}; wrote " + ", ".join(str(p) for p in paths))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
