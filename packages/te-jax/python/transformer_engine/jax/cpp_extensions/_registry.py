"""Registers te-jax's XLA FFI handlers with JAX, once, when first imported.

The native module `_te_jax_ffi` (src/ffi) holds one CPU and one CUDA handler
per op; both call te-core's C API (the CPU backend, or the CUDA backend on
XLA's stream). The CUDA ones are registered only when te-core was built with
CUDA: without that backend they could only fail.
"""

from __future__ import annotations

import re

import jaxlib

import jax
import transformer_engine.core as _core  # loads libte_core.so (and cuBLASLt) before the handlers need it

from .. import _te_jax_ffi
from .._build_info import JAXLIB_BUILT_AGAINST


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def check_jaxlib(running: str, built_against: str) -> None:
    """ImportError when jaxlib is older than the one te-jax was compiled against.

    The handlers carry the XLA FFI API version of their build's headers; an
    older jaxlib speaks an older one and refuses them at registration ("API
    version ... is incompatible"). A newer jaxlib accepts them."""
    if _release(running) < _release(built_against):
        raise ImportError(
            f"transformer_engine.jax was built against jaxlib {built_against}, but jaxlib {running} is installed: "
            f"its XLA FFI is older than the handlers'. Upgrade jax and jaxlib to >= {built_against}, or rebuild "
            "te-jax against this one: pip install --no-build-isolation --force-reinstall --no-deps ./packages/te-jax"
        )


def _register() -> None:
    """Every handler for "cpu", and for "CUDA" when te-core has that backend.
    (Runs once: at this module's first import.)"""
    cuda = _core.built_with_cuda()
    for name, platforms in _te_jax_ffi.registrations().items():
        jax.ffi.register_ffi_target(name, platforms["cpu"], platform="cpu")
        if cuda:
            jax.ffi.register_ffi_target(name, platforms["CUDA"], platform="CUDA")


check_jaxlib(jaxlib.__version__, JAXLIB_BUILT_AGAINST)
_register()
