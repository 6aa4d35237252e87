"""Loads the native module `_te_core`.

CUDA builds link cuBLASLt dynamically. So that users never set LD_LIBRARY_PATH,
the library is preloaded (RTLD_GLOBAL) from the `nvidia-cublas` wheel when that
wheel is installed (nvidia/cu13/lib for CUDA 13, nvidia/cublas/lib for CUDA 12);
a system cuBLASLt is used otherwise. CPU-only builds need nothing.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os


def _preload_cublaslt() -> None:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return
    for root in spec.submodule_search_locations:
        for path in sorted(glob.glob(os.path.join(root, "*", "lib", "libcublasLt.so.*"))):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


_preload_cublaslt()

from . import _te_core as lib  # noqa: E402

__all__ = ["lib"]
