"""Argument handling shared by the attention backends: mask types, windows,
layouts (to and from padded bshd) and ALiBi slopes.

Semantics (the reference's; docs/architecture.md "Attention"): query i and
key j of one sequence with lengths lq, lkv are visible iff
  padding:  i < lq and j < lkv
  causal:   j <= i (top-left diagonal), causal_bottom_right: j <= i + lkv - lq
  window (left, right), -1 = unbounded:  i + off - left <= j <= i + off + right
            with off = lkv - lq when bottom_right_diagonal, else 0; a causal
            mask's right bound is 0 on its own diagonal (causal: top-left,
            causal_bottom_right: bottom-right), whatever bottom_right_diagonal says
  arbitrary: attention_mask[b, h, i, j] is False (True = masked out)
"""

from __future__ import annotations

import math
import warnings

import torch

MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
QKV_FORMATS = ("sbhd", "bshd", "thd")


def normalize_mask_type(mask_type: str) -> str:
    """The canonical name ("padding,causal" and "causal,padding" -> "padding_causal")."""
    if not isinstance(mask_type, str):
        raise TypeError(f"attn_mask_type must be a str, got {type(mask_type).__name__}")
    name = mask_type.replace(",", "_")
    if name == "causal_padding":
        name = "padding_causal"
    if name not in MASK_TYPES:
        raise ValueError(f"attn_mask_type must be one of {MASK_TYPES}, got {mask_type!r}")
    return name


def check_set_window_size(mask_type: str, window_size):
    """(left, right) with -1 = unbounded. Causal masks imply right = 0 (a
    window with another right bound gets right = 0 and a warning); None
    means no window beyond what the mask type implies."""
    causal = "causal" in mask_type
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair (left, right) of ints, got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1 = unbounded), got {window_size!r}")
    if causal and right != 0:
        warnings.warn(
            f"window_size={window_size!r} with attn_mask_type={mask_type!r}: a causal mask has no keys "
            f"to the right of the diagonal, using ({left}, 0)",
            stacklevel=3,
        )
        right = 0
    return (left, right)


def default_bottom_right(mask_type: str, bottom_right_diagonal) -> bool:
    """The diagonal the window and ALiBi align to: the reference's default is
    top-left for causal/padding_causal and bottom-right for the others."""
    if bottom_right_diagonal is not None:
        return bool(bottom_right_diagonal)
    return mask_type not in ("causal", "padding_causal")


def alibi_slopes_default(num_heads: int, device) -> torch.Tensor:
    """The ALiBi paper's slopes: 2^(-8(h+1)/H) for H a power of two; otherwise
    those of the closest power of two below H, then every other slope of
    twice that many (FP32 [H])."""

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(closest)
    if closest != num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def lengths(cu_seqlens: torch.Tensor) -> torch.Tensor:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).long()


def check_cu_seqlens(name: str, cu: torch.Tensor | None, batch: int | None = None) -> None:
    if cu is None:
        return
    if cu.dtype != torch.int32 or cu.dim() != 1:
        raise ValueError(f"{name} must be a 1-D torch.int32 tensor [batch_size + 1], got {cu.dtype} {tuple(cu.shape)}")
    if batch is not None and cu.numel() != batch + 1:
        raise ValueError(f"{name} must have batch_size + 1 = {batch + 1} entries, got {cu.numel()}")


class Padded:
    """One of q/k/v as padded bshd [b, s, h, d] with a validity mask [b, s],
    and how to put an output of the same layout back into the caller's format."""

    def __init__(self, t, fmt, cu_seqlens=None, cu_seqlens_padded=None, max_seqlen=None):
        self.fmt = fmt
        if fmt == "bshd":
            self.data = t
        elif fmt == "sbhd":
            self.data = t.transpose(0, 1)
        else:  # thd: gather each sequence's tokens into a row of [b, max_s]
            if cu_seqlens is None:
                raise ValueError("qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv")
            lens = lengths(cu_seqlens)
            starts = (cu_seqlens if cu_seqlens_padded is None else cu_seqlens_padded)[:-1].long()
            s = int(lens.max()) if max_seqlen is None else int(max_seqlen)
            s = max(s, 1)
            pos = torch.arange(s, device=t.device)
            self.valid = pos[None, :] < lens[:, None]
            self.index = (starts[:, None] + pos[None, :]).clamp(max=max(t.shape[0] - 1, 0))
            self.total = t.shape[0]
            gathered = t[self.index]  # [b, s, h, d]
            self.data = gathered * self.valid[:, :, None, None].to(t.dtype)
            return
        self.valid = None

    def restore(self, out: torch.Tensor) -> torch.Tensor:
        """out [b, s, h, d] (this tensor's padded layout) -> the caller's format."""
        if self.fmt == "bshd":
            return out
        if self.fmt == "sbhd":
            return out.transpose(0, 1)
        flat = torch.zeros((self.total,) + out.shape[2:], dtype=out.dtype, device=out.device)
        return flat.index_put((self.index[self.valid],), out[self.valid])


def split_format(qkv_format: str):
    """ "sbhd_2bshd" -> ("sbhd", "bshd") (queries, keys/values); "bshd" -> ("bshd", "bshd")."""
    if "_2" in qkv_format:
        q_fmt, kv_fmt = qkv_format.split("_2")
        return q_fmt, kv_fmt
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    return qkv_format, qkv_format


def padding_validity(mask_type, attention_mask, cu_q, cu_kv, q: Padded, kv: Padded, sq, skv, device):
    """(q_valid [b, sq], kv_valid [b, skv]) booleans, or None for no padding."""
    if q.valid is not None or kv.valid is not None:
        qv = q.valid if q.valid is not None else _from_cu(cu_q, sq, device)
        kvv = kv.valid if kv.valid is not None else _from_cu(cu_kv, skv, device)
        return qv, kvv
    if "padding" not in mask_type:
        return None
    if cu_q is not None or cu_kv is not None:
        return _from_cu(cu_q, sq, device), _from_cu(cu_kv, skv, device)
    if attention_mask is None:
        return None
    if isinstance(attention_mask, (tuple, list)):
        mq, mkv = attention_mask
    else:
        mq = mkv = attention_mask
    return _from_mask(mq, sq, "attention_mask (queries)"), _from_mask(mkv, skv, "attention_mask (keys)")


def _from_cu(cu, s, device):
    if cu is None:
        return None
    return torch.arange(s, device=device)[None, :] < lengths(cu).to(device)[:, None]


def _from_mask(mask, s, name):
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = masked out), got {mask.dtype}")
    if mask.shape[-1] != s:
        raise ValueError(f"{name} must have shape [batch, 1, 1, {s}], got {tuple(mask.shape)}")
    return ~mask.reshape(mask.shape[0], s)
