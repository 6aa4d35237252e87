"""te.moe_permute / moe_permute_with_probs / moe_permute_and_pad_with_probs / moe_unpermute /
moe_sort_chunks_by_index[_with_probs] against float64 references written plainly here:
loops over tokens and experts build the permutation as a dense one-hot matrix P
(permuted = P @ x, unpermuted = P^T @ (w * permuted)), whose transposes give the gradients.

Odd shapes (37 tokens, 5 experts, hidden 24, topk 1..3), hostile routing (tokens routed to no
expert, num_out_tokens below the routed count, negative indices, zero probs), FP32 and BF16.
Permutes are copies, so they are compared bit for bit; sums within the accumulation bound of
the dtype the reference kernels accumulate in (FP32 for the mask map, the input dtype for
the index map).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from pt_helpers import assert_fullgraph_matches_eager, assert_within, hostile

import transformer_engine.pytorch as te
from transformer_engine.core.testing.tolerances import unit_roundoff
from transformer_engine.pytorch import permutation, router

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.moe]

TOKENS, EXPERTS, HIDDEN = 37, 5, 24
U32 = 2.0**-24


def _routing_mask(topk, device, unrouted=(0, 11, 36)):
    """[TOKENS, EXPERTS] int32, topk distinct experts per token; the `unrouted` tokens get none."""
    mask = torch.zeros(TOKENS, EXPERTS, dtype=torch.int32)
    for t in range(TOKENS):
        if t not in unrouted:
            mask[t, torch.randperm(EXPERTS)[:topk]] = 1
    return mask.to(device)


def _mask_routes(mask, num_out, pad_offsets=None):
    """[(token, expert, row)] in the expert-major order, dropping rows >= num_out."""
    routes, count = [], 0
    for e in range(mask.shape[1]):
        for t in range(mask.shape[0]):
            if mask[t, e]:
                if count < num_out:
                    routes.append((t, e, count + (int(pad_offsets[e]) if pad_offsets is not None else 0)))
                count += 1
    return routes


def _one_hot(routes, num_rows, num_tokens):
    p = torch.zeros(num_rows, num_tokens, dtype=torch.float64)
    for t, _, r in routes:
        p[r, t] = 1.0
    return p


def _same_bits(a, b):
    """Bitwise equality (NaN payloads and -0.0 included)."""
    view = torch.int16 if a.element_size() == 2 else torch.int32
    return a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


def _sum_bound(abs_sum, ref, dtype, acc_u, terms):
    """|err| of a sum of `terms` products accumulated with unit roundoff acc_u, rounded to dtype."""
    return terms * acc_u * abs_sum + unit_roundoff(dtype) * ref.abs() + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk", [1, 2, 3])
@pytest.mark.parametrize("drop", [False, True], ids=["all", "dropped"])
def test_mask_permute_with_probs_and_unpermute(device, dtype, topk, drop):
    mask = _routing_mask(topk, device)
    routed = int(mask.sum())
    num_out = routed - 7 if drop else routed
    x = hostile((TOKENS, HIDDEN), dtype, device).requires_grad_()
    probs = (torch.rand(TOKENS, EXPERTS, device=device) * mask + 0.01 * mask).to(dtype).requires_grad_()

    out, permuted_probs, row_id_map = te.moe_permute_with_probs(x, probs, mask, num_out)
    routes = _mask_routes(mask.cpu(), num_out)
    assert row_id_map.dtype == torch.int32 and row_id_map.shape == (TOKENS, 2 * EXPERTS + 1)
    expected = torch.zeros(num_out, HIDDEN, dtype=dtype)
    expected_probs = torch.zeros(num_out, dtype=dtype)
    for t, e, r in routes:
        expected[r], expected_probs[r] = x[t].detach().cpu(), probs[t, e].detach().cpu()
    assert _same_bits(out.detach().cpu(), expected), "permuted rows are not copies of the token rows"
    assert torch.equal(permuted_probs.detach().cpu(), expected_probs)
    for t in range(TOKENS):  # the row_id_map's own layout: kept routes, descending row order
        mine = [(r, e) for tt, e, r in routes if tt == t]
        n = int(row_id_map[t, -1])
        assert n == len(mine)
        assert row_id_map[t, :n].tolist() == sorted((r for r, _ in mine), reverse=True)
        assert row_id_map[t, EXPERTS : EXPERTS + n].tolist() == [e for _, e in sorted(mine, reverse=True)]

    grad_out = torch.randn(num_out, HIDDEN, device=device).to(dtype)
    grad_probs = torch.randn(num_out, device=device).to(dtype)
    torch.autograd.backward([out, permuted_probs], [grad_out, grad_probs])
    p = _one_hot(routes, num_out, TOKENS)
    ref = p.T @ grad_out.double().cpu()
    bound = _sum_bound(p.T @ grad_out.double().cpu().abs(), ref, dtype, U32, topk)
    assert_within(x.grad.cpu(), ref, bound, "d permute / d inp")
    ref_probs_grad = torch.zeros(TOKENS, EXPERTS, dtype=dtype)
    for t, e, r in routes:
        ref_probs_grad[t, e] = grad_probs[r].cpu()
    assert torch.equal(probs.grad.cpu(), ref_probs_grad)

    # Unpermute with merging probs: y[t] = sum_e w[t, e] permuted[row(t, e)].
    inp = torch.randn(num_out, HIDDEN, device=device).to(dtype).requires_grad_()
    merging = torch.rand(TOKENS, EXPERTS, device=device).requires_grad_()
    y = te.moe_unpermute(inp, row_id_map, merging_probs=merging, restore_shape=x.shape)
    w = torch.zeros(num_out, dtype=torch.float64)
    for t, e, r in routes:
        w[r] = merging[t, e].double()
    inp64 = inp.detach().double().cpu()
    ref_y = p.T @ (w.unsqueeze(1) * inp64)
    assert y.dtype == dtype
    assert_within(
        y.cpu(), ref_y, _sum_bound(p.T @ (w.unsqueeze(1) * inp64).abs(), ref_y, dtype, U32, topk + 1), "unpermute"
    )
    g = torch.randn(TOKENS, HIDDEN, device=device).to(dtype)
    y.backward(g)
    g64 = g.double().cpu()
    ref_inp_grad = w.unsqueeze(1) * (p @ g64)
    assert_within(
        inp.grad.cpu(), ref_inp_grad, _sum_bound(ref_inp_grad.abs(), ref_inp_grad, dtype, U32, 1), "d unpermute / d inp"
    )
    ref_w_grad = torch.zeros(TOKENS, EXPERTS, dtype=torch.float64)
    abs_w_grad = torch.zeros(TOKENS, EXPERTS, dtype=torch.float64)
    for t, e, r in routes:
        ref_w_grad[t, e] = inp64[r] @ g64[t]
        abs_w_grad[t, e] = inp64[r].abs() @ g64[t].abs()
    bound = _sum_bound(abs_w_grad, ref_w_grad, torch.float32, U32, HIDDEN)
    assert_within(merging.grad.cpu(), ref_w_grad, bound, "d unpermute / d merging_probs")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mask_permute_unpermute_roundtrip(device, dtype):
    """moe_permute then moe_unpermute without probs: each token comes back times its route count."""
    mask = _routing_mask(2, device)
    x = torch.randn(TOKENS, HIDDEN, device=device).to(dtype).requires_grad_()
    out, row_id_map = te.moe_permute(x, mask, int(mask.sum()))
    with pytest.raises(ValueError, match="restore_shape"):
        te.moe_unpermute(out, row_id_map)  # restore_shape defaults to inp's shape, as in the reference
    y = te.moe_unpermute(out, row_id_map, restore_shape=x.shape)
    count = mask.sum(1, keepdim=True).to(dtype)
    assert torch.equal(y, x.detach() * count)  # x + x is exact
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, count.expand(-1, HIDDEN))


def test_mask_zero_probs_zero_rows(device):
    """A routed slot with prob exactly 0 is a zero row (the reference's drop-and-pad rule);
    its gradient still reaches the token, as in the reference."""
    mask = _routing_mask(2, device)
    probs = torch.rand(TOKENS, EXPERTS, device=device) * mask
    t0 = int(mask[:, 1].nonzero()[0])
    probs[t0, 1] = 0.0
    x = torch.randn(TOKENS, HIDDEN, device=device, requires_grad=True)
    out, permuted_probs, row_id_map = te.moe_permute_with_probs(x, probs, mask, int(mask.sum()))
    row = [r for t, e, r in _mask_routes(mask.cpu(), int(mask.sum())) if (t, e) == (t0, 1)][0]
    assert permuted_probs[row] == 0 and torch.equal(out[row], torch.zeros(HIDDEN, device=device))
    g = torch.zeros_like(out)
    g[row] = 1.0
    out.backward(g)
    assert torch.equal(x.grad[t0], torch.ones(HIDDEN, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_and_pad_with_probs(device, dtype):
    mask = _routing_mask(2, device)
    mask[:, 3] = 0  # an expert with no token: no rows, no padding
    tokens_per_expert = mask.sum(0)
    align = 8
    x = torch.randn(TOKENS, HIDDEN, device=device).to(dtype).requires_grad_()
    probs = (torch.rand(TOKENS, EXPERTS, device=device) * 0.9 + 0.1).mul(mask).to(dtype).requires_grad_()
    out, permuted_probs, row_id_map, pad_offsets, padded = te.moe_permute_and_pad_with_probs(
        x, probs, mask, tokens_per_expert, align
    )
    counts = tokens_per_expert.cpu().tolist()
    ref_padded = [(c + align - 1) // align * align for c in counts]
    assert padded.tolist() == ref_padded and out.shape == (sum(ref_padded), HIDDEN)
    offsets, pad = [], 0
    for c, pc in zip(counts, ref_padded):
        offsets.append(pad)
        pad += pc - c
    assert pad_offsets.tolist() == offsets
    routes = _mask_routes(mask.cpu(), int(mask.sum()), pad_offsets.cpu())
    expected = torch.zeros(out.shape, dtype=dtype)
    for t, _, r in routes:
        expected[r] = x[t].detach().cpu()
    assert torch.equal(out.detach().cpu(), expected)  # padding rows are zeros
    assert int((permuted_probs != 0).sum()) == len(routes)

    y = te.moe_unpermute(out, row_id_map, merging_probs=probs, restore_shape=x.shape, pad_offsets=pad_offsets)
    ref = x.detach().double() * (probs.detach().double().sum(1, keepdim=True))
    assert_within(y, ref, _sum_bound(ref.abs(), ref, dtype, U32, 3), "padded unpermute")
    y.sum().backward()
    assert x.grad.shape == x.shape and probs.grad.shape == probs.shape

    # Already aligned: no padding, pad_offsets None.
    aligned = te.moe_permute_and_pad_with_probs(x.detach(), probs.detach(), mask, tokens_per_expert, 1)
    assert aligned[3] is None and aligned[0].shape[0] == int(mask.sum())


def _index_routes(index, num_out):
    """{(t, k): row} of the index map: a stable sort by expert, negatives (as uint32) last."""
    num_tokens, topk = index.shape
    flat = [(int(index[t, k]) % 2**32, t * topk + k) for t in range(num_tokens) for k in range(topk)]
    order = sorted(flat)
    return {divmod(src, topk): p for p, (_, src) in enumerate(order) if p < num_out}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk", [1, 2, 3])
@pytest.mark.parametrize("drop", [False, True], ids=["all", "dropped"])
def test_index_permute_unpermute(device, dtype, topk, drop):
    index = torch.stack([torch.randperm(EXPERTS)[:topk] for _ in range(TOKENS)]).to(torch.int32)
    index[5, 0] = -1  # routed nowhere on this rank: sorts last
    index = index.to(device)
    num_out = TOKENS * topk - (9 if drop else 0)
    x = hostile((TOKENS, HIDDEN), dtype, device).requires_grad_()
    out, row_id_map = te.moe_permute(x, index, num_out, map_type="index")
    routes = _index_routes(index.cpu(), num_out)
    assert row_id_map.shape == (TOKENS * topk,) and row_id_map.dtype == torch.int32
    expected_map = torch.full((topk, TOKENS), -1, dtype=torch.int32)
    expected = torch.zeros(num_out, HIDDEN, dtype=dtype)
    for (t, k), r in routes.items():
        expected_map[k, t] = r
        expected[r] = x[t].detach().cpu()
    assert torch.equal(row_id_map.cpu(), expected_map.reshape(-1))
    assert _same_bits(out.detach().cpu(), expected)

    # Backward of the permute: each token sums its rows' gradients in the dtype.
    g = torch.randn(num_out, HIDDEN, device=device).to(dtype)
    out.backward(g)
    p = _one_hot([(t, 0, r) for (t, _), r in routes.items()], num_out, TOKENS)
    ref = p.T @ g.double().cpu()
    bound = _sum_bound(p.T @ g.double().cpu().abs(), ref, dtype, unit_roundoff(dtype), topk)
    assert_within(x.grad.cpu(), ref, bound, "d permute / d inp (index)")

    inp = torch.randn(num_out, HIDDEN, device=device).to(dtype).requires_grad_()
    probs = torch.rand(TOKENS, topk, device=device).requires_grad_()
    y = te.moe_unpermute(inp, row_id_map, probs, map_type="index")
    w = torch.zeros(num_out, dtype=torch.float64)
    for (t, k), r in routes.items():
        w[r] = probs[t, k].to(dtype).double()  # the kernel rounds the probs to the dtype
    inp64 = inp.detach().double().cpu()
    ref_y = p.T @ (w.unsqueeze(1) * inp64)
    bound = _sum_bound(p.T @ (w.unsqueeze(1) * inp64).abs(), ref_y, dtype, unit_roundoff(dtype), topk + 1)
    assert_within(y.cpu(), ref_y, bound, "unpermute (index)")
    gy = torch.randn(TOKENS, HIDDEN, device=device).to(dtype)
    y.backward(gy)
    g64 = gy.double().cpu()
    ref_inp_grad = w.unsqueeze(1) * (p @ g64)
    bound = _sum_bound(ref_inp_grad.abs(), ref_inp_grad, dtype, unit_roundoff(dtype), 1)
    assert_within(inp.grad.cpu(), ref_inp_grad, bound, "d unpermute / d inp (index)")
    ref_probs_grad = torch.zeros(TOKENS, topk, dtype=torch.float64)
    abs_probs_grad = torch.zeros(TOKENS, topk, dtype=torch.float64)
    for (t, k), r in routes.items():
        ref_probs_grad[t, k] = inp64[r] @ g64[t]
        abs_probs_grad[t, k] = inp64[r].abs() @ g64[t].abs()
    bound = _sum_bound(abs_probs_grad, ref_probs_grad, torch.float32, unit_roundoff(dtype), HIDDEN + 1)
    assert_within(probs.grad.cpu(), ref_probs_grad, bound, "d unpermute / d probs (index)")


def test_index_unpermute_without_probs_returns_each_route(device):
    """Without merging_probs the reference's index unpermute returns [topk * num_tokens, hidden]."""
    index = torch.stack([torch.randperm(EXPERTS)[:2] for _ in range(TOKENS)]).to(device)
    x = torch.randn(TOKENS, HIDDEN, device=device)
    out, row_id_map = te.moe_permute(x, index, 0, map_type="index")  # 0: every route
    back = te.moe_unpermute(out, row_id_map, map_type="index")
    assert torch.equal(back, x.repeat(2, 1))  # k-major: route (t, k) at row k * TOKENS + t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_probs", [False, True])
def test_sort_chunks_by_index(device, dtype, with_probs):
    sizes = [4, 0, 9, 1, 7, 0, 11]  # sum 32 < TOKENS: the 5 rows past it stay in place
    order = torch.randperm(len(sizes))
    split_sizes = torch.tensor(sizes, dtype=torch.int32, device=device)
    x = hostile((TOKENS, HIDDEN), dtype, device).requires_grad_()
    probs = torch.rand(TOKENS, device=device).requires_grad_()
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    source = [r for c in order.tolist() for r in range(starts[c], starts[c] + sizes[c])]
    source += list(range(sum(sizes), TOKENS))
    if with_probs:
        out, out_probs = te.moe_sort_chunks_by_index_with_probs(x, probs, split_sizes, order.to(device))
        assert torch.equal(out_probs.detach().cpu(), probs.detach().cpu()[source])
    else:
        out = te.moe_sort_chunks_by_index(x, split_sizes, order.to(device))
    assert _same_bits(out.detach().cpu(), x.detach().cpu()[source])
    g = torch.randn(TOKENS, HIDDEN, device=device).to(dtype)
    if with_probs:
        gp = torch.randn(TOKENS, device=device)
        torch.autograd.backward([out, out_probs], [g, gp])
        ref_gp = torch.empty(TOKENS)
        ref_gp[source] = gp.cpu()
        assert torch.equal(probs.grad.cpu(), ref_gp)
    else:
        out.backward(g)
    ref_g = torch.empty(TOKENS, HIDDEN, dtype=dtype)
    ref_g[source] = g.cpu()
    assert torch.equal(x.grad.cpu(), ref_g)


def test_empty_input(device):
    x = torch.randn(0, HIDDEN, device=device, requires_grad=True)
    mask = torch.zeros(0, EXPERTS, dtype=torch.int32, device=device)
    out, probs_out, row_id_map = te.moe_permute_with_probs(x, torch.zeros(0, EXPERTS, device=device), mask, 5)
    assert out.shape == (0, HIDDEN) and probs_out.shape == (0,)
    y = te.moe_unpermute(out, row_id_map, restore_shape=x.shape)
    y.sum().backward()
    assert y.shape == (0, HIDDEN) and x.grad.shape == (0, HIDDEN)
    out, row_id_map = te.moe_permute(x, torch.zeros(0, 2, dtype=torch.int32, device=device), 0, map_type="index")
    assert out.shape == (0, HIDDEN)


def test_argument_errors():
    x = torch.randn(TOKENS, HIDDEN)
    mask = _routing_mask(2, "cpu")
    with pytest.raises(ValueError, match="num_out_tokens"):
        te.moe_permute(x, mask, 0)
    with pytest.raises(ValueError, match="map_type"):
        te.moe_permute(x, mask, 10, map_type="dense")
    with pytest.raises(ValueError, match="routing_map"):
        te.moe_permute(x, mask[:5], 10)
    out, row_id_map = te.moe_permute(x, mask, int(mask.sum()))
    with pytest.raises(ValueError, match="restore_shape"):
        te.moe_unpermute(out, row_id_map, restore_shape=(TOKENS + 1, HIDDEN))
    with pytest.raises(ValueError, match="both merging_probs and probs"):
        te.moe_unpermute(out, row_id_map, merging_probs=mask.float(), probs=mask.float(), restore_shape=x.shape)
    with pytest.warns(DeprecationWarning, match="probs is deprecated"):
        te.moe_unpermute(out, row_id_map, probs=mask.float(), restore_shape=x.shape)
    with pytest.raises(ValueError, match="align_size"):
        te.moe_permute_and_pad_with_probs(x, mask.float(), mask, mask.sum(0), 0)
    q = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, "cpu")(x)
    with pytest.raises(TypeError, match="quantized"):
        te.moe_permute(q, mask, int(mask.sum()))


def test_compile_fullgraph_matches_eager():
    """permute -> unpermute (mask map with probs, and index map) in one compiled graph."""
    mask = _routing_mask(2, "cpu")
    index = torch.stack([torch.randperm(EXPERTS)[:2] for _ in range(TOKENS)])
    num_out = int(mask.sum())

    def step(x, probs, merging):
        out, permuted_probs, row_id_map = te.moe_permute_with_probs(x, probs, mask, num_out)
        y = te.moe_unpermute(out * permuted_probs.unsqueeze(1), row_id_map, merging, restore_shape=x.shape)
        out_i, map_i = te.moe_permute(x, index, 0, map_type="index")
        z = te.moe_unpermute(out_i, map_i, merging[:, :2], map_type="index")
        return y + z

    def run(fn):
        torch.manual_seed(0)
        args = [torch.randn(TOKENS, HIDDEN), torch.rand(TOKENS, EXPERTS), torch.rand(TOKENS, EXPERTS)]
        args = [a.requires_grad_() for a in args]
        y = fn(*args)
        y.square().sum().backward()
        return [y.detach()] + [a.grad for a in args]

    assert_fullgraph_matches_eager(step, run)


def test_reference_signatures():
    """The reference's parameter names and defaults, and the top-level re-exports."""
    expected = {
        permutation.moe_permute: "inp, routing_map, num_out_tokens, max_token_num=-1, map_type='mask'",
        permutation.moe_permute_with_probs: "inp, probs, routing_map, num_out_tokens",
        permutation.moe_permute_and_pad_with_probs: "inp, probs, routing_map, tokens_per_expert, align_size",
        permutation.moe_unpermute: (
            "inp, row_id_map, merging_probs=None, restore_shape=None, map_type='mask', probs=None, pad_offsets=None"
        ),
        permutation.moe_sort_chunks_by_index: "inp, split_sizes, sorted_index",
        permutation.moe_sort_chunks_by_index_with_probs: "inp, probs, split_sizes, sorted_index",
        router.fused_topk_with_score_function: (
            "logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor, score_function, expert_bias, "
            "routing_map_format=RoutingMapFormat.BYTEMAP, topk_indices=None, qb_histogram=None, qb_bin_bounds=None, "
            "qb_histogram_mode=None"
        ),
        router.fused_compute_score_for_moe_aux_loss: (
            "logits, topk, score_function, routing_map_format=RoutingMapFormat.BYTEMAP"
        ),
        router.fused_moe_aux_loss: "probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff",
    }
    for fn, params in expected.items():
        got = ", ".join(
            p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
            for p in inspect.signature(fn).parameters.values()
        )
        got = got.replace("<RoutingMapFormat.BYTEMAP: 0>", "RoutingMapFormat.BYTEMAP")
        assert got == params, fn.__name__
        if fn.__module__.endswith("permutation"):
            assert getattr(te, fn.__name__) is fn and fn.__name__ in te.__all__
