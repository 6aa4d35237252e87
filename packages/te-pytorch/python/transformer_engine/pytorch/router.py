"""Fused functions of the MoE router, with the reference's signatures:
``fused_topk_with_score_function``, ``fused_compute_score_for_moe_aux_loss`` and
``fused_moe_aux_loss``.

Precision, as the reference's kernels: inputs are converted to FP32, all math and every
reduction is FP32, ``scores`` stay FP32 and outputs are rounded once to the input dtype.
Float64 logits are rejected, as the reference rejects them. Built from torch ops
(_router_math) in autograd Functions with the kernels' backward formulas: CPU and CUDA,
and torch.compile.

Not supported: Quantile Balancing (``qb_histogram``, ``qb_bin_bounds``,
``qb_histogram_mode``) raises NotImplementedError.
"""

from __future__ import annotations

import enum

import numpy as np
import torch

from . import _router_math as rm

__all__ = [
    "QBHistogramMode",
    "RoutingMapFormat",
    "fused_topk_with_score_function",
    "fused_compute_score_for_moe_aux_loss",
    "fused_moe_aux_loss",
]


class RoutingMapFormat(enum.IntEnum):
    """Layout of the routing map: BYTEMAP bool [..., num_experts]; BITMAP_U8 uint8
    [..., ceil(num_experts / 8)], bit e % 8 of byte e // 8 set when routed to expert e."""

    BYTEMAP = 0
    BITMAP_U8 = 1


class QBHistogramMode(enum.IntEnum):
    """The reference's Quantile Balancing histogram modes (QB is not supported here)."""

    TWO_KERNEL = 0
    FUSED_ATOMIC = 1


def _routing_map_format(owner: str, value) -> RoutingMapFormat:
    if isinstance(value, str):
        names = {"bytemap": RoutingMapFormat.BYTEMAP, "bitmap_u8": RoutingMapFormat.BITMAP_U8}
        if value in names:
            return names[value]
        raise ValueError(f"{owner}: routing_map_format must be 'bytemap' or 'bitmap_u8', got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return RoutingMapFormat(value)
    raise ValueError(
        f"{owner}: routing_map_format must be a RoutingMapFormat, 0, 1, 'bytemap' or 'bitmap_u8', got {value!r}"
    )


def _routing_map(indices: torch.Tensor, num_experts: int, fmt: RoutingMapFormat, lead_shape) -> torch.Tensor:
    tokens = indices.size(0)
    mask = torch.zeros((tokens, num_experts), dtype=torch.bool, device=indices.device)
    mask = mask.scatter(1, indices, True)
    if fmt == RoutingMapFormat.BITMAP_U8:
        num_bytes = (num_experts + 7) // 8
        bits = torch.nn.functional.pad(mask, (0, num_bytes * 8 - num_experts)).view(tokens, num_bytes, 8)
        weights = torch.tensor([1 << b for b in range(8)], dtype=torch.int32, device=indices.device)
        return (bits.to(torch.int32) * weights).sum(-1).to(torch.uint8).view(*lead_shape, num_bytes)
    return mask.view(*lead_shape, num_experts)


def _check_logits(owner: str, logits, topk) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() < 1 or logits.numel() == 0:
        raise ValueError(f"{owner}: logits must be a non-empty tensor [..., num_experts]")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        # The reference rejects float64 ("not supported router type") and every non-float.
        raise TypeError(f"{owner}: logits must be float32, bfloat16 or float16, got {logits.dtype}")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= logits.size(-1):
        raise ValueError(f"{owner}: topk must be in [1, num_experts={logits.size(-1)}], got {topk!r}")


class _TopkScore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, topk, use_pre_softmax, num_groups, group_topk, scaling, score_function, expert_bias):
        x = logits.reshape(-1, logits.size(-1)).float()
        probs, indices, saved = rm.topk_forward(
            x, topk, use_pre_softmax, num_groups, group_topk, scaling, score_function, expert_bias
        )
        routed = torch.zeros_like(x, dtype=torch.bool).scatter(1, indices, True)
        ctx.save_for_backward(routed, saved)
        ctx.config = (topk, use_pre_softmax, scaling, score_function)
        ctx.mark_non_differentiable(indices)
        return probs.to(logits.dtype).view(logits.shape), indices

    @staticmethod
    def backward(ctx, grad_probs, _grad_indices):
        routed, saved = ctx.saved_tensors
        topk, use_pre_softmax, scaling, score_function = ctx.config
        g = rm.topk_backward(
            grad_probs.reshape(routed.shape), routed, saved, topk, use_pre_softmax, scaling, score_function
        )
        return g.to(grad_probs.dtype).view(grad_probs.shape), None, None, None, None, None, None, None


def fused_topk_with_score_function(
    logits: torch.Tensor,
    topk: int,
    use_pre_softmax: bool,
    num_groups: int | None,
    group_topk: int | None,
    scaling_factor: float | None,
    score_function: str,
    expert_bias: torch.Tensor | None,
    routing_map_format=RoutingMapFormat.BYTEMAP,
    topk_indices: torch.Tensor | None = None,
    qb_histogram: torch.Tensor | None = None,
    qb_bin_bounds: torch.Tensor | None = None,
    qb_histogram_mode: str | None = None,
):
    """Router top-k: score the experts, keep each token's ``topk`` best, return their probs.

    ``score_function``: ``"softmax"`` (``use_pre_softmax``: softmax over all experts, then
    top-k; else top-k of the logits, then softmax over the k), ``"sigmoid"`` or
    ``"sqrtsoftplus"`` (sqrt(softplus(x))), whose k scores are normalized to sum to 1 when
    topk > 1. ``expert_bias`` (FP32 [num_experts], sigmoid / sqrtsoftplus only) is added to
    the scores for the selection only. ``num_groups`` / ``group_topk``: group-limited top-k
    (the experts split into num_groups groups, a group scored by the sum of its best
    topk // group_topk scores, the top-k taken in the group_topk best groups).
    ``scaling_factor`` (None: 1) multiplies the probs.

    Returns ``(probs, routing_map)``: probs in logits' dtype and shape, zero where not routed;
    routing_map as ``routing_map_format`` says, or, when ``topk_indices``
    ([..., topk] int16/int32/int64) is given, that tensor filled with the chosen experts.
    Ties between equal scores are broken as the reference's kernels break them
    (see _router_math).
    """
    owner = "fused_topk_with_score_function"
    if qb_histogram is not None or qb_bin_bounds is not None or qb_histogram_mode is not None:
        raise NotImplementedError(
            f"{owner}: Quantile Balancing (qb_histogram, qb_bin_bounds, qb_histogram_mode) is not supported"
        )
    _check_logits(owner, logits, topk)
    fmt = _routing_map_format(owner, routing_map_format)
    if score_function not in rm.SCORE_FUNCTIONS:
        raise ValueError(f"{owner}: score_function must be softmax, sigmoid or sqrtsoftplus, got {score_function!r}")
    num_experts = logits.size(-1)
    if expert_bias is not None:
        if score_function == "softmax":
            raise ValueError(f"{owner}: expert_bias needs score_function sigmoid or sqrtsoftplus, got softmax")
        if expert_bias.dtype != torch.float32 or expert_bias.shape != (num_experts,):
            raise TypeError(
                f"{owner}: expert_bias must be float32 [num_experts={num_experts}], "
                f"got {expert_bias.dtype} {tuple(expert_bias.shape)}"
            )
    if score_function != "softmax":
        use_pre_softmax = False  # a softmax-only option, ignored otherwise as in the reference
    grouped = group_topk is not None and group_topk > 0
    if grouped:
        if num_groups is None or num_groups <= 0 or num_experts % num_groups or topk % group_topk:
            raise ValueError(
                f"{owner}: group_topk={group_topk} needs num_groups dividing num_experts={num_experts} "
                f"and group_topk dividing topk={topk}, got num_groups={num_groups}"
            )
        if group_topk > num_groups or topk // group_topk > num_experts // num_groups:
            raise ValueError(
                f"{owner}: group_topk={group_topk} groups of topk // group_topk = {topk // group_topk} experts "
                f"do not fit {num_groups} groups of {num_experts // num_groups}"
            )
    if topk_indices is not None:
        if fmt != RoutingMapFormat.BYTEMAP:
            raise ValueError(f"{owner}: topk_indices cannot be combined with routing_map_format={fmt.name}")
        expected = (*logits.shape[:-1], topk)
        if topk_indices.dtype not in (torch.int16, torch.int32, torch.int64) or tuple(topk_indices.shape) != expected:
            raise ValueError(
                f"{owner}: topk_indices must be int16/int32/int64 of shape {expected}, "
                f"got {topk_indices.dtype} {tuple(topk_indices.shape)}"
            )
    scaling = 1.0 if scaling_factor is None else float(scaling_factor)
    probs, indices = _TopkScore.apply(
        logits, topk, use_pre_softmax, num_groups, group_topk if grouped else None, scaling, score_function, expert_bias
    )
    if topk_indices is not None:
        with torch.no_grad():
            topk_indices.copy_(indices.view(topk_indices.shape))
        return probs, topk_indices
    return probs, _routing_map(indices, num_experts, fmt, logits.shape[:-1])


class _AuxScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, topk, score_function):
        x = logits.reshape(-1, logits.size(-1)).float()
        scores, indices, saved = rm.aux_scores_forward(x, topk, score_function)
        ctx.save_for_backward(saved)
        ctx.score_function = score_function
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(indices)
        return scores.view(logits.shape), indices

    @staticmethod
    def backward(ctx, grad_scores, _grad_indices):
        (saved,) = ctx.saved_tensors
        g = rm.aux_scores_backward(grad_scores.reshape(saved.shape), saved, ctx.score_function)
        return g.to(ctx.logits_dtype).view(grad_scores.shape), None, None


def fused_compute_score_for_moe_aux_loss(
    logits: torch.Tensor, topk: int, score_function: str, routing_map_format=RoutingMapFormat.BYTEMAP
):
    """Scores for the load-balancing loss: softmax over the experts, or sigmoid /
    sqrtsoftplus normalized to sum to 1 over all experts; and each token's top-k of them.

    Returns ``(routing_map, scores)``: routing_map as ``routing_map_format`` says, scores FP32
    in logits' shape (gradients flow from scores to logits, in logits' dtype).
    """
    owner = "fused_compute_score_for_moe_aux_loss"
    _check_logits(owner, logits, topk)
    fmt = _routing_map_format(owner, routing_map_format)
    if score_function not in rm.SCORE_FUNCTIONS:
        raise ValueError(f"{owner}: score_function must be softmax, sigmoid or sqrtsoftplus, got {score_function!r}")
    scores, indices = _AuxScores.apply(logits, topk, score_function)
    return _routing_map(indices, logits.size(-1), fmt, logits.shape[:-1]), scores


class _AuxLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, probs, tokens_per_expert, coefficient):
        # sum over experts of (sum over tokens of probs) * tokens_per_expert, FP32 throughout
        weighted = probs.float().sum(0) * tokens_per_expert.float()
        ctx.save_for_backward(tokens_per_expert, coefficient)
        ctx.rows = probs.size(0)
        return (weighted.sum() * coefficient).to(probs.dtype)

    @staticmethod
    def backward(ctx, grad_loss):
        tokens_per_expert, coefficient = ctx.saved_tensors
        # the kernel's C * tokens_per_expert[i] * grad, in that order, FP32
        row = coefficient * tokens_per_expert.float() * grad_loss.float()
        return row.to(grad_loss.dtype).expand(ctx.rows, -1).contiguous(), None, None


def fused_moe_aux_loss(
    probs: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    total_num_tokens,
    num_experts: int,
    topk: int,
    coeff: float,
) -> torch.Tensor:
    """The load-balancing (aux) loss
    ``coeff * num_experts / (topk * total_num_tokens**2) * sum_e (sum_t probs[t, e]) * tokens_per_expert[e]``.

    ``probs`` [num_tokens, num_cols] (num_cols a multiple of num_experts: sequence-level
    losses batch sequences along it), ``tokens_per_expert`` [num_cols] (ints or floats, no
    gradient), ``total_num_tokens`` an int or a 0-dim integer tensor (kept on the device, no
    sync). Returns a 0-dim tensor in probs' dtype; the coefficient is computed in FP32 as the
    reference computes it.
    """
    owner = "fused_moe_aux_loss"
    if probs.dim() != 2 or probs.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(
            f"{owner}: probs must be a 2-D float32/bfloat16/float16 tensor, got {probs.dtype} {tuple(probs.shape)}"
        )
    num_cols = probs.size(1)
    if num_experts <= 0 or num_cols % num_experts:
        raise ValueError(f"{owner}: probs' {num_cols} columns must be a multiple of num_experts={num_experts}")
    if tokens_per_expert.numel() != num_cols:
        raise ValueError(f"{owner}: tokens_per_expert must have {num_cols} entries, got {tokens_per_expert.numel()}")
    if isinstance(total_num_tokens, torch.Tensor):
        total = total_num_tokens.to(device=probs.device, dtype=torch.float32).reshape(())
        coefficient = num_experts * torch.tensor(coeff, dtype=torch.float32, device=probs.device) / topk / total / total
    else:
        # (num_experts * coeff) / topk / total / total with FP32 rounding at every step
        c = np.float32(num_experts) * np.float32(coeff) / np.float32(topk)
        c = c / np.float32(total_num_tokens) / np.float32(total_num_tokens)
        coefficient = torch.tensor(float(c), dtype=torch.float32, device=probs.device)
    return _AuxLoss.apply(probs, tokens_per_expert.reshape(-1).to(probs.device), coefficient)
