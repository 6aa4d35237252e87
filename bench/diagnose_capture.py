"""Find the call that breaks a CUDA-graph capture of a te.LayerNormMLP step.

A capture that goes wrong often reports it only at its end ("operation failed
due to a previous error during capture"). This script captures one training
step with a profile hook that asks the driver, after every Python and C
function return, whether the capturing stream is still capturing
(cuStreamIsCapturing: 1 active, 2 invalidated); the first return that sees
"invalidated" is printed with its Python stack. It then retries the capture
under capture_error_mode "thread_local" and "relaxed": if those pass, the
breaking call is one CUDA forbids only while another thread captures (the
autograd engine runs backward on its own thread).

    python bench/diagnose_capture.py [--hidden 4096 --ffn 14336 --tokens 8192] [--recipe bf16] [--eager-first]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import traceback

import torch
from bench_te_pytorch_linear import _warm_up_on_side_stream  # (bench/ is on sys.path when run as a script)

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core import lib

RECIPES = {"bf16": lambda: None, "delayed": recipe.DelayedScaling, "current": recipe.Float8CurrentScaling}
_INVALIDATED = 2  # CU_STREAM_CAPTURE_STATUS_INVALIDATED


class CaptureWatch:
    """sys.setprofile hook: records the first return after which the capture is invalidated."""

    def __init__(self):
        self.driver = ctypes.CDLL("libcuda.so.1")
        self.stream = None
        self.first = None

    def status(self) -> int:
        value = ctypes.c_int(0)
        self.driver.cuStreamIsCapturing(ctypes.c_void_p(self.stream), ctypes.byref(value))
        return value.value

    def __call__(self, frame, event, arg):
        if self.first is not None or event not in ("return", "c_return", "c_exception"):
            return
        if self.status() == _INVALIDATED:
            name = getattr(arg, "__qualname__", None) or getattr(arg, "__name__", None) or frame.f_code.co_name
            where = "".join(traceback.format_stack(frame, limit=12))
            self.first = f"after {event} of {name!r}:\n{where}"

    def check_after(self, what: str) -> None:
        if self.first is None and self.stream is not None and self.status() == _INVALIDATED:
            self.first = f"after te-core call {what} (thread {threading.current_thread().name})"

    def start(self):
        self.stream = torch.cuda.current_stream().cuda_stream
        sys.setprofile(self)
        # Backward runs on autograd's device threads: hook them too where Python allows.
        set_all = getattr(threading, "setprofile_all_threads", None)
        if set_all is not None:
            set_all(self)

    def stop(self):
        self.stream = None
        sys.setprofile(None)
        set_all = getattr(threading, "setprofile_all_threads", None)
        if set_all is not None:
            set_all(None)


def wrap_core_calls(watch: CaptureWatch) -> None:
    """Every te-core binding checks the capture after it returns (on whichever thread calls it)."""
    for name in dir(lib):
        fn = getattr(lib, name)
        if name.startswith("_") or not callable(fn) or isinstance(fn, type):
            continue

        def checked(*a, _fn=fn, _name=name, **k):
            result = _fn(*a, **k)
            watch.check_after(_name)
            return result

        setattr(lib, name, checked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=14336)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--recipe", choices=list(RECIPES), default="bf16")
    parser.add_argument(
        "--eager-first", action="store_true", help="run steps on the default stream first (as the benchmark)"
    )
    args = parser.parse_args()
    layer = te.LayerNormMLP(
        args.hidden, args.ffn, normalization="RMSNorm", activation="swiglu", params_dtype=torch.bfloat16, device="cuda"
    )
    fp8_recipe = RECIPES[args.recipe]()
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16)

    def step():
        x.grad = None
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = layer(x)
        y.backward(dy)
        layer.zero_grad(set_to_none=True)

    for _ in range(3 if args.eager_first else 0):
        step()
    _warm_up_on_side_stream(step, torch.device("cuda"))
    torch.cuda.synchronize()
    print(f"LayerNormMLP {args.hidden}/{args.ffn}, {args.tokens} tokens, recipe {args.recipe}")
    watch = CaptureWatch()
    wrap_core_calls(watch)
    for mode in ("global", "thread_local", "relaxed"):
        watch.first = None
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode=mode):
                watch.start()
                try:
                    step()
                finally:
                    watch.stop()
            graph.replay()
            torch.cuda.synchronize()
            print(f"capture_error_mode={mode}: captured and replayed")
        except RuntimeError as err:
            print(f"capture_error_mode={mode}: FAILED: {str(err).splitlines()[0]}")
            traceback.print_exc(limit=6)
        if watch.first is not None:
            print(f"  first invalidated {watch.first}")
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
