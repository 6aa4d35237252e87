"""Registers te-jax's XLA FFI handlers with JAX, once, on import.

The native module `_te_jax_ffi` (src/ffi) holds one CPU and one CUDA handler
per op; both call te-core's C API (the CPU backend, or the CUDA backend on
XLA's stream). The CUDA ones are registered only when te-core was built with
CUDA: without that backend they could only fail.
"""

from __future__ import annotations

import jax
import transformer_engine.core as _core  # loads libte_core.so (and cuBLASLt) before the handlers need it

from .. import _te_jax_ffi

_REGISTERED = False


def ensure_registered() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    cuda = _core.built_with_cuda()
    for name, platforms in _te_jax_ffi.registrations().items():
        jax.ffi.register_ffi_target(name, platforms["cpu"], platform="cpu")
        if cuda:
            jax.ffi.register_ffi_target(name, platforms["CUDA"], platform="CUDA")
    _REGISTERED = True


ensure_registered()
