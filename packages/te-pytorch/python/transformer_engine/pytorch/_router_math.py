"""The math of the fused MoE router (router.py): score functions, the reference kernels'
top-k selection, and the explicit backward formulas, all in FP32 like the reference's
kernels (inputs converted to FP32 on load, one rounding to the output dtype on store).

Top-k tie-breaking follows the reference's two selection kernels, picked as it picks them:
  * topk < 16 (or more than 8160 experts): a warp-wide arg-max, topk times. Each of the 32
    lanes scans elements lane, lane + 32, ... keeping the first maximum, and the
    butterfly reduction keeps the lower lane on a tie, so among equal scores the winner is
    the lowest (i % 32, i // 32): for <= 32 candidates, the lowest index. Selected in
    descending score order.
  * topk >= 16: a radix selection of the k-th value; ties broken by ascending index, and the
    selected elements listed as the ones above the k-th value, then the ones equal to it,
    each group in ascending index order.
That order is visible in the dense topk_indices output and in the order group scores are
summed; the set of selected experts is what the routing map and probs show.
"""

from __future__ import annotations

import torch

EPSILON = 1e-20  # the reference kernels' epsilon in the normalizations
RADIX_TOPK_THRESHOLD = 16  # NVTE_RADIX_TOPK_THRESHOLD's default
MAX_EXPERTS_RADIX = 255 * 32  # the radix kernel's 8-bit histogram limit
SCORE_FUNCTIONS = ("sigmoid", "softmax", "sqrtsoftplus")


def uses_radix(topk: int, num_experts: int) -> bool:
    return topk >= RADIX_TOPK_THRESHOLD and num_experts <= MAX_EXPERTS_RADIX


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))  # the kernel's formula, not torch.sigmoid's


def sqrtsoftplus(x: torch.Tensor) -> torch.Tensor:
    # softplus(x) = log1p(exp(x)), taken as x above 20 (the kernel's cutoff)
    return torch.sqrt(torch.where(x > 20.0, x, torch.log1p(torch.exp(x))))


def softmax(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e * (1.0 / e.sum(-1, keepdim=True))  # the kernel multiplies by 1 / sum


def select_topk(scores: torch.Tensor, k: int, radix: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest along the last dim, in the reference kernel's order."""
    n = scores.size(-1)
    position = torch.arange(n, device=scores.device)
    if radix:
        values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
        values, indices = values[..., :k], indices[..., :k]
        tied = values == values[..., k - 1 : k]
        order = torch.argsort(tied.to(torch.int64) * n + indices, dim=-1)
        return values.gather(-1, order), indices.gather(-1, order)
    # Stable sort over the candidates laid out lane-major: ties go to the lowest lane.
    lanes = torch.argsort((position % 32) * n + position)
    values, picked = torch.sort(scores[..., lanes], dim=-1, descending=True, stable=True)
    return values[..., :k], lanes[picked[..., :k]]


def grouped_topk(scores, topk: int, num_groups: int, group_topk: int, radix: bool):
    """Group-limited top-k: score each of num_groups expert groups by the sum of its best
    topk // group_topk scores, keep the group_topk best groups, take the top-k inside them."""
    tokens, experts = scores.shape
    group_size = experts // num_groups
    best, _ = select_topk(scores.view(tokens, num_groups, group_size), topk // group_topk, radix)
    group_scores = best[..., 0]
    for j in range(1, best.size(-1)):  # summed in selection order, as the kernel does
        group_scores = group_scores + best[..., j]
    _, groups = select_topk(group_scores, group_topk, radix)
    keep = torch.zeros((tokens, num_groups), dtype=torch.bool, device=scores.device).scatter(1, groups, True)
    masked = scores.masked_fill(~keep.repeat_interleave(group_size, dim=1), float("-inf"))
    return select_topk(masked, topk, radix)


def topk_forward(x, topk, use_pre_softmax, num_groups, group_topk, scaling_factor, score_function, expert_bias):
    """x: FP32 [tokens, experts]. Returns (probs FP32, indices [tokens, topk], saved FP32):
    saved is what the backward needs (sigmoid: sigmoid(x); softmax: the softmax output over
    all experts (pre) or the routed subset (post, zeros elsewhere); sqrtsoftplus: x)."""
    radix = uses_radix(topk, x.size(1))
    if score_function == "softmax":
        scores = softmax(x) if use_pre_softmax else x
        saved = scores
    elif score_function == "sigmoid":
        scores = saved = sigmoid(x)
    else:
        saved, scores = x, sqrtsoftplus(x)
    biased = expert_bias is not None and score_function != "softmax"
    selecting = scores + expert_bias.float() if biased else scores
    if group_topk is not None and group_topk > 0:
        values, indices = grouped_topk(selecting, topk, num_groups, group_topk, radix)
    else:
        values, indices = select_topk(selecting, topk, radix)
    if biased:
        # (s + b) - b, as the kernel reverts the bias, not a fresh gather of s
        values = values - expert_bias.float()[indices]
    if score_function == "softmax" and not use_pre_softmax:
        values = softmax(values)
        saved = torch.zeros_like(x).scatter(1, indices, values)
    if score_function != "softmax" and topk > 1:
        values = values / (values.sum(-1, keepdim=True) + EPSILON)
    probs = torch.zeros_like(x).scatter(1, indices, scaling_factor * values)
    return probs, indices, saved


def topk_backward(grad, routed, saved, topk, use_pre_softmax, scaling_factor, score_function):
    """grad_logits (FP32) of topk_forward's probs, the reference kernel's formulas; the
    selection is a constant (no gradient to the bias or through the choice)."""
    g = grad.float() * scaling_factor
    if score_function != "softmax":
        act = saved if score_function == "sigmoid" else sqrtsoftplus(saved)
        if topk > 1:
            denom = torch.where(routed, act, 0).sum(-1, keepdim=True) + EPSILON
            dot = torch.where(routed, g * act, 0).sum(-1, keepdim=True)
            g = g / denom - dot / (denom * denom)
    elif not use_pre_softmax:
        dot = torch.where(routed, g * saved, 0).sum(-1, keepdim=True)
        g = saved * (g - dot)
    g = torch.where(routed, g, 0)
    if score_function == "softmax" and use_pre_softmax:
        g = saved * (g - (g * saved).sum(-1, keepdim=True))
    elif score_function == "sigmoid":
        g = g * saved * (1.0 - saved)
    elif score_function == "sqrtsoftplus":
        g = g * _sqrtsoftplus_slope(saved)
    return g


def _sqrtsoftplus_slope(x):
    # d sqrt(softplus(x)) / dx = sigmoid(x) / (2 y), 1 / (2 y) above 20; eps as the kernel's
    twice_y = 2.0 * sqrtsoftplus(x) + EPSILON
    return torch.where(x > 20.0, 1.0 / twice_y, sigmoid(x) / twice_y)


def aux_scores_forward(x, topk, score_function):
    """Scores for the aux loss (FP32, normalized over all experts for sigmoid /
    sqrtsoftplus), their top-k indices, and what the backward needs."""
    if score_function == "softmax":
        scores = saved = softmax(x)
    else:
        act = sigmoid(x) if score_function == "sigmoid" else sqrtsoftplus(x)
        saved = act if score_function == "sigmoid" else x
        scores = act / (act.sum(-1, keepdim=True) + EPSILON)
    _, indices = select_topk(scores, topk, uses_radix(topk, x.size(1)))
    return scores, indices, saved


def aux_scores_backward(grad, saved, score_function):
    g = grad.float()
    if score_function == "softmax":
        return saved * (g - (g * saved).sum(-1, keepdim=True))
    act = saved if score_function == "sigmoid" else sqrtsoftplus(saved)
    denom = act.sum(-1, keepdim=True) + EPSILON
    g = g / denom - (g * act).sum(-1, keepdim=True) / (denom * denom)
    if score_function == "sigmoid":
        return g * act * (1.0 - act)
    return g * _sqrtsoftplus_slope(saved)
