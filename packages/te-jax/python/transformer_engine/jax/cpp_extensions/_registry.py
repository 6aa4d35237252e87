"""Registers te-jax's XLA FFI handlers with JAX, once, when first imported.

The native module `_te_jax_ffi` (src/ffi) holds one CPU and one CUDA handler
per op; both call te-core's C API (the CPU backend, or the CUDA backend on
XLA's stream). The CUDA ones are registered only when te-core was built with
CUDA: without that backend they could only fail.
"""

from __future__ import annotations

import jax
import transformer_engine.core as _core  # loads libte_core.so (and cuBLASLt) before the handlers need it

from .. import _te_jax_ffi


def _register() -> None:
    """Every handler for "cpu", and for "CUDA" when te-core has that backend.
    (Runs once: at this module's first import.)"""
    cuda = _core.built_with_cuda()
    for name, platforms in _te_jax_ffi.registrations().items():
        jax.ffi.register_ffi_target(name, platforms["cpu"], platform="cpu")
        if cuda:
            jax.ffi.register_ffi_target(name, platforms["CUDA"], platform="CUDA")


_register()
