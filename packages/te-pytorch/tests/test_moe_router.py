"""transformer_engine.pytorch.router against float64 references written plainly here: a loop
over tokens picks each token's experts (the reference kernels' tie rules spelled out as
key orders), float64 torch math computes the probs from the picked experts, and float64
autograd through that reference gives the expected gradients (the selection a constant).

Logits are spread apart (a random permutation of evenly spaced values plus small noise) so
that the float64 and FP32 selections agree; exact ties are tested on their own. Odd shapes
(37 tokens, 5, 12, 13 and 40 experts, topk 1..3, 16), FP32 and BF16.
"""

from __future__ import annotations

import math

import pytest
import torch
from pt_helpers import assert_fullgraph_matches_eager, assert_within

from transformer_engine.core.testing.tolerances import unit_roundoff
from transformer_engine.pytorch.router import (
    RoutingMapFormat,
    fused_compute_score_for_moe_aux_loss,
    fused_moe_aux_loss,
    fused_topk_with_score_function,
)

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.moe]

TOKENS = 37
U32 = 2.0**-24


def _logits(experts, dtype, device, tokens=TOKENS, spacing=None):
    spacing = spacing or 4.0 / experts
    rows = [torch.randperm(experts).double() * spacing - 2.0 for _ in range(tokens)]
    x = torch.stack(rows) + 0.01 * spacing * torch.rand(tokens, experts, dtype=torch.float64)
    return x.to(dtype).to(device)


def _lane_key(i):
    return (i % 32, i // 32)


def _pick(values, k, radix):
    """One token's top-k in the reference kernel's order (values: a list of floats)."""
    n = len(values)
    if radix:  # value descending, index ascending; listed above-k-th first, then ties
        chosen = sorted(range(n), key=lambda i: (-values[i], i))[:k]
        kth = values[chosen[-1]]
        return sorted(i for i in chosen if values[i] > kth) + sorted(i for i in chosen if values[i] == kth)
    chosen = []  # k arg-max passes, ties to the lowest (lane, i // 32)
    for _ in range(k):
        best = None
        for i in sorted(range(n), key=_lane_key):
            if i not in chosen and (best is None or values[i] > values[best]):
                best = i
        chosen.append(best)
    return chosen


def _sigmoid(x):
    return 1 / (1 + torch.exp(-x))


def _sqrtsoftplus(x):
    return torch.sqrt(torch.log1p(torch.exp(x)))


def _reference(x, topk, pre, num_groups, group_topk, scaling, score_function, bias):
    """(probs float64 [T, E] differentiable in x, picked experts per token)."""
    tokens, experts = x.shape
    radix = topk >= 16
    if score_function == "softmax":
        scores = torch.softmax(x, -1) if pre else x
    else:
        scores = _sigmoid(x) if score_function == "sigmoid" else _sqrtsoftplus(x)
    selecting = (scores + bias.double()) if bias is not None else scores
    rows, picks = [], []
    for t in range(tokens):
        s = selecting[t].detach().tolist()
        if group_topk:
            size = experts // num_groups
            group_score = []
            for g in range(num_groups):
                part = s[g * size : (g + 1) * size]
                group_score.append(sum(part[i] for i in _pick(part, topk // group_topk, radix)))
            groups = _pick(group_score, group_topk, radix)
            s = [v if i // size in groups else -math.inf for i, v in enumerate(s)]
        chosen = _pick(s, topk, radix)
        picks.append(chosen)
        v = scores[t, chosen]
        if score_function == "softmax" and not pre:
            v = torch.softmax(v, -1)
        if score_function != "softmax" and topk > 1:
            v = v / v.sum()
        row = torch.zeros(experts, dtype=torch.float64).index_put((torch.tensor(chosen),), v * scaling)
        rows.append(row)
    return torch.stack(rows), picks


def _bound(ref, dtype, experts, upstream=None):
    """One rounding to dtype plus FP32 math error at the scale of the row (of the result, and
    of the upstream gradient for a gradient: its terms cancel)."""
    scale = ref.abs().amax(-1, keepdim=True)
    if upstream is not None:
        scale = scale + upstream.double().cpu().abs().amax(-1, keepdim=True)
    return unit_roundoff(dtype) * ref.abs() + 16 * experts * U32 * scale + 1e-30


CASES = [(f, v) for f in ("softmax", "sigmoid", "sqrtsoftplus") for v in (False, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk", [1, 2, 3])
@pytest.mark.parametrize(
    "score_function,variant", CASES, ids=[f"{f}-{'pre' if f == 'softmax' else 'bias'}{int(v)}" for f, v in CASES]
)
def test_topk_with_score_function(device, dtype, topk, score_function, variant):
    experts = 5
    logits = _logits(experts, dtype, device).requires_grad_()
    pre = score_function == "softmax" and variant
    bias = torch.randn(experts, device=device) * 0.05 if score_function != "softmax" and variant else None
    scaling = 2.5 if topk == 2 else None
    probs, routing_map = fused_topk_with_score_function(logits, topk, pre, None, None, scaling, score_function, bias)
    x = logits.detach().double().cpu().requires_grad_()
    ref, picks = _reference(
        x, topk, pre, None, None, scaling or 1.0, score_function, None if bias is None else bias.cpu()
    )
    assert probs.dtype == dtype and routing_map.dtype == torch.bool
    expected_map = torch.zeros(TOKENS, experts, dtype=torch.bool)
    for t, chosen in enumerate(picks):
        expected_map[t, chosen] = True
    assert torch.equal(routing_map.cpu(), expected_map)
    assert_within(probs.detach().cpu(), ref, _bound(ref, dtype, experts), "probs")
    grad = torch.randn(TOKENS, experts, device=device).to(dtype)
    probs.backward(grad)
    ref.backward(grad.double().cpu())
    assert logits.grad.dtype == dtype
    assert_within(
        logits.grad.cpu(), x.grad, _bound(x.grad, dtype, experts, grad * (scaling or 1.0)), "d probs / d logits"
    )


@pytest.mark.parametrize("topk", [5, 16], ids=["warp_argmax", "radix"])
def test_many_experts(device, topk):
    """40 experts: more than a warp's 32 lanes, and the radix selection for topk >= 16."""
    experts = 40
    logits = _logits(experts, torch.float32, device).requires_grad_()
    bias = torch.randn(experts, device=device) * 0.01
    probs, routing_map = fused_topk_with_score_function(logits, topk, False, None, None, None, "sigmoid", bias)
    x = logits.detach().double().cpu().requires_grad_()
    ref, picks = _reference(x, topk, False, None, None, 1.0, "sigmoid", bias.cpu())
    for t, chosen in enumerate(picks):
        assert sorted(routing_map[t].nonzero().flatten().tolist()) == sorted(chosen)
    assert_within(probs.detach().cpu(), ref, _bound(ref, torch.float32, experts), "probs")
    grad = torch.randn(TOKENS, experts, device=device)
    probs.backward(grad)
    ref.backward(grad.double().cpu())
    assert_within(logits.grad.cpu(), x.grad, _bound(x.grad, torch.float32, experts, grad), "d probs / d logits")


@pytest.mark.parametrize("score_function", ["softmax", "sigmoid"])
def test_group_limited_topk(device, score_function):
    experts, num_groups, group_topk, topk = 12, 4, 2, 4
    logits = _logits(experts, torch.float32, device).view(1, TOKENS, experts).requires_grad_()
    bias = torch.randn(experts, device=device) * 0.05 if score_function == "sigmoid" else None
    pre = score_function == "softmax"
    probs, routing_map = fused_topk_with_score_function(
        logits, topk, pre, num_groups, group_topk, 1.0, score_function, bias
    )
    assert probs.shape == logits.shape and routing_map.shape == logits.shape
    x = logits.detach().view(TOKENS, experts).double().cpu().requires_grad_()
    ref, picks = _reference(
        x, topk, pre, num_groups, group_topk, 1.0, score_function, None if bias is None else bias.cpu()
    )
    for t, chosen in enumerate(picks):
        assert sorted(routing_map[0, t].nonzero().flatten().tolist()) == sorted(chosen)
        assert len({i // 3 for i in chosen}) <= group_topk
    assert_within(probs.detach().view(TOKENS, experts).cpu(), ref, _bound(ref, torch.float32, experts), "probs")
    grad = torch.randn(probs.shape, device=device)
    probs.backward(grad)
    ref.backward(grad.view(TOKENS, experts).double().cpu())
    got = logits.grad.view(TOKENS, experts).cpu()
    assert_within(
        got, x.grad, _bound(x.grad, torch.float32, experts, grad.view(TOKENS, experts)), "d probs / d logits (grouped)"
    )


def test_topk_tie_breaking():
    """Exact ties: for topk < 16 the reference kernel's warp arg-max prefers the lowest lane
    (index % 32), so index 33 (lane 1) beats index 2; for topk >= 16 (radix) the lowest index
    wins and the selection is listed above-k-th first, ascending."""
    experts = 40
    logits = torch.linspace(-3, -1, experts).repeat(2, 1)
    logits[:, 2] = logits[:, 33] = 5.0
    indices = torch.empty(2, 2, dtype=torch.int64)
    fused_topk_with_score_function(logits, 2, False, None, None, None, "softmax", None, topk_indices=indices)
    assert indices.tolist() == [[33, 2], [33, 2]]
    logits = torch.zeros(1, experts)
    logits[0, 35] = 1.0
    indices = torch.empty(1, 16, dtype=torch.int32)
    probs, out = fused_topk_with_score_function(
        logits, 16, False, None, None, None, "sigmoid", None, topk_indices=indices
    )
    assert out is indices
    assert indices.tolist() == [[35] + list(range(15))]
    assert _pick(logits[0].tolist(), 16, True) == indices[0].tolist()
    logits = torch.zeros(1, experts)
    assert _pick(logits[0].tolist(), 3, False) == [0, 32, 1]
    indices = torch.empty(1, 3, dtype=torch.int16)
    fused_topk_with_score_function(logits, 3, False, None, None, None, "sigmoid", None, topk_indices=indices)
    assert indices.tolist() == [[0, 32, 1]]


def test_routing_map_formats(device):
    experts = 13
    logits = _logits(experts, torch.float32, device)
    probs, byte_map = fused_topk_with_score_function(logits, 3, False, None, None, None, "sigmoid", None)
    for fmt in ("bitmap_u8", RoutingMapFormat.BITMAP_U8, 1):
        _, bits = fused_topk_with_score_function(logits, 3, False, None, None, None, "sigmoid", None, fmt)
        assert bits.dtype == torch.uint8 and bits.shape == (TOKENS, 2)
        for t in range(TOKENS):
            for e in range(experts):
                assert bool((int(bits[t, e // 8]) >> (e % 8)) & 1) == bool(byte_map[t, e])
    bits, _ = fused_compute_score_for_moe_aux_loss(logits, 3, "sigmoid", "bitmap_u8")
    assert bits.shape == (TOKENS, 2)
    with pytest.raises(ValueError, match="routing_map_format"):
        fused_topk_with_score_function(logits, 3, False, None, None, None, "sigmoid", None, "bitmap")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk", [1, 3])
@pytest.mark.parametrize("score_function", ["softmax", "sigmoid", "sqrtsoftplus"])
def test_score_for_aux_loss(device, dtype, topk, score_function):
    experts = 5
    logits = _logits(experts, dtype, device).requires_grad_()
    routing_map, scores = fused_compute_score_for_moe_aux_loss(logits, topk, score_function)
    assert scores.dtype == torch.float32 and routing_map.dtype == torch.bool
    x = logits.detach().double().cpu().requires_grad_()
    if score_function == "softmax":
        ref = torch.softmax(x, -1)
    else:
        act = _sigmoid(x) if score_function == "sigmoid" else _sqrtsoftplus(x)
        ref = act / act.sum(-1, keepdim=True)
    for t in range(TOKENS):
        chosen = _pick(ref[t].tolist(), topk, False)
        assert sorted(routing_map[t].nonzero().flatten().tolist()) == sorted(chosen)
    assert_within(scores.detach().cpu(), ref, _bound(ref, torch.float32, experts), "scores")
    grad = torch.randn(TOKENS, experts, device=device)
    scores.backward(grad)
    ref.backward(grad.double().cpu())
    assert logits.grad.dtype == dtype
    assert_within(logits.grad.cpu(), x.grad, _bound(x.grad, dtype, experts, grad), "d scores / d logits")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("total_as_tensor", [False, True])
def test_moe_aux_loss(device, dtype, total_as_tensor):
    experts, topk, coeff, sequences = 5, 2, 0.01, 2  # sequence-level: two sequences side by side
    probs = torch.rand(TOKENS, experts * sequences, device=device).to(dtype).requires_grad_()
    tokens_per_expert = torch.randint(0, TOKENS, (experts * sequences,), device=device)
    total = torch.tensor(TOKENS * 3, device=device) if total_as_tensor else TOKENS * 3
    loss = fused_moe_aux_loss(probs, tokens_per_expert, total, experts, topk, coeff)
    value = loss.detach().item()
    assert loss.shape == () and loss.dtype == dtype
    c = experts * coeff / (topk * (TOKENS * 3) ** 2)
    p64 = probs.detach().double().cpu()
    ref = c * sum(float(tokens_per_expert[e]) * float(p64[:, e].sum()) for e in range(experts * sequences))
    terms = c * (p64 * tokens_per_expert.double().cpu()).sum()
    bound = unit_roundoff(dtype) * abs(ref) + (TOKENS + experts * sequences + 4) * U32 * float(terms)
    assert abs(value - ref) <= bound
    loss.backward(torch.tensor(3.0, device=device, dtype=dtype))
    ref_grad = (3.0 * c * tokens_per_expert.double().cpu()).expand(TOKENS, -1)
    assert probs.grad.dtype == dtype
    assert_within(
        probs.grad.cpu(), ref_grad, unit_roundoff(dtype) * ref_grad.abs() + 4 * U32 * ref_grad.abs() + 1e-30, "grad"
    )


def test_argument_errors():
    logits = torch.randn(TOKENS, 5)
    with pytest.raises(TypeError, match="float64"):
        fused_topk_with_score_function(logits.double(), 2, False, None, None, None, "softmax", None)
    with pytest.raises(ValueError, match="expert_bias"):
        fused_topk_with_score_function(logits, 2, False, None, None, None, "softmax", torch.zeros(5))
    with pytest.raises(TypeError, match="expert_bias"):
        fused_topk_with_score_function(logits, 2, False, None, None, None, "sigmoid", torch.zeros(5).bfloat16())
    with pytest.raises(ValueError, match="score_function"):
        fused_topk_with_score_function(logits, 2, False, None, None, None, "relu", None)
    with pytest.raises(ValueError, match="topk"):
        fused_topk_with_score_function(logits, 6, False, None, None, None, "softmax", None)
    with pytest.raises(ValueError, match="num_groups"):
        fused_topk_with_score_function(logits, 2, False, 2, 1, None, "softmax", None)
    with pytest.raises(NotImplementedError, match="qb_histogram"):
        fused_topk_with_score_function(
            logits, 2, False, None, None, None, "sigmoid", torch.zeros(5), qb_histogram=torch.zeros(5, 4)
        )
    with pytest.raises(ValueError, match="topk_indices"):
        fused_topk_with_score_function(
            logits, 2, False, None, None, None, "softmax", None, topk_indices=torch.empty(TOKENS, 3, dtype=torch.int32)
        )
    with pytest.raises(ValueError, match="num_experts"):
        fused_moe_aux_loss(torch.rand(TOKENS, 7), torch.ones(7), TOKENS, 5, 2, 0.1)


def test_compile_fullgraph_matches_eager():
    bias = torch.randn(12) * 0.05

    def step(logits):
        probs, routing_map = fused_topk_with_score_function(logits, 4, False, 4, 2, 1.5, "sigmoid", bias)
        _, scores = fused_compute_score_for_moe_aux_loss(logits, 4, "softmax")
        aux = fused_moe_aux_loss(scores, routing_map.sum(0), TOKENS, 12, 4, 0.01)
        return probs.square().sum() + aux

    def run(fn):
        torch.manual_seed(0)
        logits = torch.randn(TOKENS, 12, requires_grad=True)
        loss = fn(logits)
        loss.backward()
        return loss.detach(), logits.grad

    assert_fullgraph_matches_eager(step, run)
