"""The index-map permutation (moe_permute / moe_unpermute with map_type="index") and the
chunk sort (moe_sort_chunks_by_index[_with_probs]), as torch ops in autograd Functions.

Index map, as the reference's CUDA kernels: the [num_tokens, topk] expert indices are
flattened token-major and stably sorted by expert (a radix sort of the keys read as uint32,
so negative indices, e.g. -1 for "routed elsewhere", sort after every expert); permuted row p
holds the p-th route. row_id_map is int32 [topk * num_tokens], k-major:
row_id_map[k * num_tokens + t] is the row of route (t, k), or -1 when that route was dropped
(p >= num_out_tokens). The combine accumulates in the input dtype, one rounding per
addition in k order, with the probs rounded to that dtype first: the reference's unpermute
kernel computes in T (half only for FP8 data).
"""

from __future__ import annotations

import torch


def permute_index_rows(index: torch.Tensor, num_out_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted source routes [num_tokens * topk] as t * topk + k, row_id_map int32)."""
    num_tokens, topk = index.shape
    n = num_tokens * topk
    keys = index.reshape(-1).to(torch.int64)
    keys = torch.where(keys < 0, keys + 2**32, keys)
    order = torch.argsort(keys, stable=True)
    position = torch.empty_like(order).scatter(0, order, torch.arange(n, device=index.device))
    position = position.view(num_tokens, topk).T.reshape(-1)
    row_id_map = torch.where(position < num_out_tokens, position, -1).to(torch.int32)
    return order, row_id_map


def combine_index(x: torch.Tensor, row_id_map: torch.Tensor, num_tokens: int, topk: int, probs=None):
    """out[t] = sum_k x[row_id_map[k * num_tokens + t]] (* probs[t, k]), in x.dtype."""
    rows = row_id_map.view(topk, num_tokens).to(torch.int64)
    if x.size(0) == 0:
        return x.new_zeros((num_tokens, x.size(1)))
    out = None
    for k in range(topk):
        taken = (rows[k] >= 0).unsqueeze(1)
        term = torch.where(taken, x[rows[k].clamp(min=0)], 0)
        if probs is not None:
            term = term * probs[:, k : k + 1]
        out = term if out is None else out + term
    return out


class PermuteIndex(torch.autograd.Function):
    """(inp, index [num_tokens, topk], num_out_tokens) -> (output, row_id_map)."""

    @staticmethod
    def forward(ctx, inp, index, num_out_tokens):
        num_tokens, topk = index.shape
        order, row_id_map = permute_index_rows(index, num_out_tokens)
        filled = min(num_out_tokens, num_tokens * topk)
        output = inp[order[:filled] // topk]
        if num_out_tokens > filled:
            # The reference leaves these rows unwritten; zeros here.
            output = torch.cat([output, output.new_zeros((num_out_tokens - filled, inp.size(1)))])
        ctx.mark_non_differentiable(row_id_map)
        ctx.save_for_backward(row_id_map)
        ctx.shape = (num_tokens, topk)
        return output, row_id_map

    @staticmethod
    def backward(ctx, grad_output, _grad_row_id_map):
        (row_id_map,) = ctx.saved_tensors
        return combine_index(grad_output, row_id_map, *ctx.shape), None, None


class UnpermuteIndex(torch.autograd.Function):
    """(inp, row_id_map, probs FP32 [num_tokens, topk] or None) -> combined tokens.

    Without probs the reference takes num_tokens = row_id_map.numel() and topk = 1: every
    route comes back as its own row (k-major), nothing is summed."""

    @staticmethod
    def forward(ctx, inp, row_id_map, probs):
        num_tokens, topk = probs.shape if probs is not None else (row_id_map.numel(), 1)
        probs_in_dtype = probs.to(inp.dtype) if probs is not None else None
        ctx.save_for_backward(inp, row_id_map, probs_in_dtype)
        ctx.shape = (num_tokens, topk)
        return combine_index(inp, row_id_map, num_tokens, topk, probs_in_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        inp, row_id_map, probs = ctx.saved_tensors
        num_tokens, topk = ctx.shape
        num_rows, hidden = inp.shape
        rows = row_id_map.view(topk, num_tokens).to(torch.int64)
        taken = rows >= 0
        slot = torch.where(taken, rows, num_rows).reshape(-1)
        grads = grad_out.unsqueeze(0).expand(topk, -1, -1)
        if probs is not None:
            grads = grads * probs.T.unsqueeze(2)  # rounded to the dtype, as the kernel's T(g * p)
        grad_inp = torch.zeros((num_rows + 1, hidden), dtype=grad_out.dtype, device=grad_out.device)
        grad_inp = grad_inp.index_copy(0, slot, grads.reshape(-1, hidden))[:num_rows]
        grad_probs = None
        if probs is not None and ctx.needs_input_grad[2]:
            if num_rows == 0:
                grad_probs = grad_out.new_zeros((num_tokens, topk), dtype=torch.float32)
            else:
                # Products in the dtype, summed in FP32 (the kernel's float accumulators).
                fwd_rows = inp[rows.clamp(min=0)]
                dots = (grad_out.unsqueeze(0) * fwd_rows).float().sum(2)
                grad_probs = torch.where(taken, dots, 0).T
        return grad_inp, None, grad_probs


def chunk_sort_map(split_sizes: torch.Tensor, sorted_index: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Destination row of every input row (int32 [num_tokens]) when the chunks of sizes
    split_sizes are reordered as sorted_index lists them. Rows past sum(split_sizes) stay in
    place, as the reference's kernel keeps them."""
    device = split_sizes.device
    sizes = split_sizes.to(torch.int64)
    chunks = sorted_index.to(device=device, dtype=torch.int64)
    ends = torch.cumsum(sizes, 0)
    row = torch.arange(num_tokens, device=device)
    chunk = torch.searchsorted(ends, row, right=True).clamp(max=max(sizes.numel() - 1, 0))
    offset = row - (ends - sizes)[chunk]
    sorted_sizes = sizes[chunks]
    out_starts = torch.cumsum(sorted_sizes, 0) - sorted_sizes
    position = torch.empty_like(chunks).scatter(0, chunks, torch.arange(chunks.numel(), device=device))
    dst = out_starts[position[chunk]] + offset
    return torch.where(row < sizes.sum(), dst, row).to(torch.int32)


class SortChunks(torch.autograd.Function):
    """(inp, split_sizes, sorted_index, probs) -> (output, permuted_probs)."""

    @staticmethod
    def forward(ctx, inp, split_sizes, sorted_index, probs):
        num_tokens = inp.size(0)
        if num_tokens == 0 or split_sizes.numel() == 0:
            dst = torch.arange(num_tokens, device=inp.device)
        else:
            dst = chunk_sort_map(split_sizes.to(inp.device), sorted_index, num_tokens).to(torch.int64)
        source = torch.empty_like(dst).scatter(0, dst, torch.arange(num_tokens, device=inp.device))
        ctx.save_for_backward(dst)
        output = inp[source]
        return output, (probs[source] if probs is not None else None)

    @staticmethod
    def backward(ctx, grad_output, grad_probs):
        (dst,) = ctx.saved_tensors
        grad_inp = grad_output[dst] if ctx.needs_input_grad[0] else None
        grad_p = grad_probs[dst] if grad_probs is not None and ctx.needs_input_grad[3] else None
        return grad_inp, None, None, grad_p
