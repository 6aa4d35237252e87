"""The "flash" backend: torch.nn.functional.scaled_dot_product_attention.

The reference's FlashAttention backend calls the flash-attn package; here it is
torch's SDPA, whose CUDA kernels are FlashAttention-2 and memory-efficient
attention (and cuDNN's, where torch enables it), and for thd torch's
FlashAttention-2 varlen kernel (torch.nn.attention.varlen, torch >= 2.9). It
covers the plain cases only (no bias, vanilla softmax, no mask or causal,
bshd/sbhd with GQA and dropout; thd on CUDA in FP16/BF16 without dropout and
without cu_seqlens_*_padded), which are what most models run. Measured on the H200 (2026-12-02),
te-core's own CUDA kernel is about 200x slower than SDPA on the Llama shape,
and te-core's cuDNN path is opt-in until its tests pass on the H200: so on CUDA this
backend comes first when it can run the call. On the CPU it runs only when
NVTE_FLASH_ATTN=1 asks for it (te-core's CPU backend is the default there).
"""

from __future__ import annotations

import os

import torch

from . import utils

_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # SDPA's enable_gqa
try:  # torch >= 2.9: FlashAttention-2's varlen kernel, for thd
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # pragma: no cover (older torch: thd goes to the next backend)
    _varlen_attn = None


def plan(cfg, call, q, k, v):
    """None when SDPA runs the call, else the reason it cannot (a string)."""
    if not q.is_cuda and os.environ.get("NVTE_FLASH_ATTN") != "1":
        return "the CPU (set NVTE_FLASH_ATTN=1 to use torch SDPA there)"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {q.dtype}"
    if cfg.bias_type != "no_bias" or cfg.softmax_type != "vanilla" or cfg.softcap > 0 or cfg.return_max_logit:
        return "a bias, a softmax variant, softcap or return_max_logit"
    if cfg.qkv_format == "thd":
        return _plan_thd(cfg, call, q, k, v)
    if cfg.qkv_format not in ("bshd", "sbhd"):
        return f"qkv_format={cfg.qkv_format!r}"
    sq, skv = (q.shape[1], k.shape[1]) if cfg.qkv_format == "bshd" else (q.shape[0], k.shape[0])
    causal = cfg.mask_type in ("causal", "causal_bottom_right")
    if cfg.mask_type not in ("no_mask", "causal", "causal_bottom_right"):
        return f"attn_mask_type={cfg.mask_type!r}"
    if causal and cfg.mask_type == "causal_bottom_right" and sq != skv:
        return "a bottom-right causal mask with unequal query and key lengths"
    if cfg.window not in ((-1, -1), (-1, 0)) or (cfg.window == (-1, 0) and not causal):
        return f"window_size={cfg.window}"
    if any(call.get(n) is not None for n in ("attention_mask", "cu_seqlens_q", "cu_seqlens_kv")):
        return "an attention_mask or cu_seqlens"
    if q.shape[-2] % k.shape[-2]:
        return "query heads not a multiple of the key/value heads"
    return None


def run(cfg, q, k, v, training: bool):
    """[b, s, h, d] / [s, b, h, d] in, the module's [b, s, h*dv] / [s, b, h*dv] out."""
    perm = (0, 2, 1, 3) if cfg.qkv_format == "bshd" else (1, 2, 0, 3)  # -> [b, h, s, d] views
    qh, kh, vh = (t.permute(*perm) for t in (q, k, v))
    kw = {}
    if qh.shape[1] != kh.shape[1]:
        if _GQA:
            kw["enable_gqa"] = True
        else:  # (torch < 2.5: the key/value heads repeated)
            group = qh.shape[1] // kh.shape[1]
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(
        qh,
        kh,
        vh,
        dropout_p=cfg.dropout if training else 0.0,
        is_causal=cfg.mask_type in ("causal", "causal_bottom_right"),
        scale=cfg.scale,
        **kw,
    )
    o = o.permute(0, 2, 1, 3) if cfg.qkv_format == "bshd" else o.permute(2, 0, 1, 3)
    return o.reshape(*o.shape[:2], -1)


def _plan_thd(cfg, call, q, k, v):
    """None when torch's varlen FlashAttention runs a thd call, else why not.

    Its causal diagonal and window are aligned bottom-right in each sequence:
    a top-left one (causal, padding_causal) is the same only when each query
    sequence is as long as its key sequence, which holds here when one
    cu_seqlens tensor serves both (self-attention on packed sequences)."""
    if _varlen_attn is None:
        return "qkv_format='thd' (torch.nn.attention.varlen needs torch >= 2.9)"
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return "qkv_format='thd' outside CUDA FP16/BF16"
    if cfg.dropout > 0:
        return "qkv_format='thd' with attention dropout"
    if call.get("cu_seqlens_q") is None or call.get("cu_seqlens_kv") is None or call.get("attention_mask") is not None:
        return "qkv_format='thd' without cu_seqlens_q/cu_seqlens_kv, or with an attention_mask"
    for name in ("q", "kv"):
        padded = call.get(f"cu_seqlens_{name}_padded")
        if padded is not None and padded is not call.get(f"cu_seqlens_{name}"):
            return "cu_seqlens_q_padded/cu_seqlens_kv_padded (gaps between sequences)"
    if cfg.mask_type not in ("no_mask", "padding", "causal", "padding_causal", "padding_causal_bottom_right"):
        return f"attn_mask_type={cfg.mask_type!r} with qkv_format='thd'"
    bounded = "causal" in cfg.mask_type or cfg.window != (-1, -1)
    if bounded and not cfg.bottom_right and call["cu_seqlens_q"] is not call["cu_seqlens_kv"]:
        return "a top-left causal mask or window with distinct cu_seqlens_q and cu_seqlens_kv"
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv or d % 8 or d > 256:
        return f"head sizes {d}/{dv} (FlashAttention varlen: equal, a multiple of 8, at most 256)"
    if q.shape[-2] % k.shape[-2]:
        return "query heads not a multiple of the key/value heads"
    return None


def run_thd(cfg, call, q, k, v):
    """[t, h, d] packed sequences in, the module's [t, h*d] out.

    Tokens past cu_seqlens[-1] belong to no sequence: the kernel neither reads
    nor writes their rows, and they must get zero outputs and zero gradients,
    as the other backends give. Their count is unknown here without a host
    sync (which would stall the stream and break CUDA-graph capture), so the
    zeroing is a mask over the rows: the output once in the forward, the
    q/k/v gradients in the backward (an identity whose backward masks; masking
    q, k and v themselves in the forward cost 0.31 ms on the H200's 8 x
    1024-token case against the kernel's 0.43 ms)."""
    cu_q, cu_kv = call["cu_seqlens_q"].to(torch.int32), call["cu_seqlens_kv"].to(torch.int32)
    max_q = call.get("max_seqlen_q") or int(utils.lengths(cu_q).max())
    max_kv = call.get("max_seqlen_kv") or int(utils.lengths(cu_kv).max())
    causal = "causal" in cfg.mask_type
    left, right = cfg.window
    window = (left, 0 if causal else right)
    valid_q, valid_kv = _rows_in(cu_q, q), _rows_in(cu_kv, k)
    q = _ZeroGradOutside.apply(q, valid_q)
    k, v = _ZeroGradOutside.apply(k, valid_kv), _ZeroGradOutside.apply(v, valid_kv)
    o = _varlen_attn(q, k, v, cu_q, cu_kv, int(max_q), int(max_kv), scale=cfg.scale, window_size=window)
    o = torch.where(valid_q[:, None, None], o, 0)
    return o.reshape(o.shape[0], -1)


class _ZeroGradOutside(torch.autograd.Function):
    """Identity forward (no copy); the backward zeroes the rows outside `valid`."""

    @staticmethod
    def forward(ctx, x, valid):
        ctx.save_for_backward(valid)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (valid,) = ctx.saved_tensors
        return torch.where(valid[:, None, None], grad, 0), None


def _rows_in(cu, t):
    """Boolean [t]: which rows of t are tokens of some sequence (no host sync)."""
    return torch.arange(t.shape[0], device=t.device) < cu[-1]
