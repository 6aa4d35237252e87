"""Which backend runs an attention call.

Backends, in order of preference:
  "fused"    first when te-core runs the call on cuDNN's fused attention (a
             te-core built with TE_WITH_CUDNN=ON; fused.uses_cudnn): faster than
             SDPA on the H200 (docs/benchmarks.md).
  "flash"    torch SDPA (flash.py): on CUDA, for the plain combinations (no
             bias, vanilla softmax, no mask or causal, bshd/sbhd, GQA); on the
             CPU only with NVTE_FLASH_ATTN=1.
  "fused"    te-core's attention op (kernels/attention.py): CPU and CUDA,
             the default whenever it supports the call's combination.
  "unfused"  plain torch math (unfused.py): runs every combination.

Environment (read at each call, as the reference does; docs/envvars.md):
  NVTE_FLASH_ATTN=0    never use the flash (SDPA) backend; =1 allows it on the CPU
  NVTE_FUSED_ATTN=0    never use the fused backend
  NVTE_UNFUSED_ATTN=0  never use the unfused backend
"""

from __future__ import annotations

import os

from ...kernels import attention as kernels
from . import flash, fused
from .unfused import AttnConfig, UnfusedDotProductAttention

__all__ = ["UnfusedDotProductAttention", "select_backend"]  # (the reference defines the unfused class here)


def _enabled(name: str) -> bool:
    return os.environ.get(name, "1") != "0"


def select_backend(cfg: AttnConfig, call):
    """("flash", None), ("fused", plan) or ("unfused", None); a ValueError
    naming the combination and what to change when no enabled backend can run it."""
    reasons = []
    fused_plan = None
    q = call["q"]
    if q.is_cuda and _enabled("NVTE_FUSED_ATTN") and kernels.available() and fused.cudnn_built(q.device):
        fused_plan = fused.plan(cfg, call)
        if not isinstance(fused_plan, str) and fused.uses_cudnn(fused_plan):
            return "fused", fused_plan
    if _enabled("NVTE_FLASH_ATTN"):
        why = flash.plan(cfg, call, call["q"], call["k"], call["v"])
        if why is None:
            return "flash", None
        reasons.append(f"flash: does not support {why}")
    else:
        reasons.append("flash: disabled by NVTE_FLASH_ATTN=0")
    if _enabled("NVTE_FUSED_ATTN"):
        if not kernels.available():
            reasons.append("fused: this te-core build has no attention op")
        else:
            fused_plan = fused.plan(cfg, call) if fused_plan is None else fused_plan
            if not isinstance(fused_plan, str):
                return "fused", fused_plan
            reasons.append(f"fused: does not support {fused_plan}")
    else:
        reasons.append("fused: disabled by NVTE_FUSED_ATTN=0")
    if _enabled("NVTE_UNFUSED_ATTN"):
        return "unfused", None
    reasons.append("unfused: disabled by NVTE_UNFUSED_ATTN=0")
    raise ValueError(
        "DotProductAttention: no attention backend can run qkv_format="
        f"{cfg.qkv_format!r}, attn_mask_type={cfg.mask_type!r}, window_size={cfg.window}, "
        f"core_attention_bias_type={cfg.bias_type!r}, softmax_type={cfg.softmax_type!r}, "
        f"softcap={cfg.softcap} ({'; '.join(reasons)}). Enable the unfused backend "
        "(unset NVTE_UNFUSED_ATTN), which runs every combination, or change the arguments named"
    )
