"""te-core's fused attention as torch ops (filled in when te-core has the op)."""

from __future__ import annotations

from transformer_engine.core import lib


def available() -> bool:
    return hasattr(lib, "attention_fwd")


def unsupported(cfg, call):
    return "not wired in yet"
