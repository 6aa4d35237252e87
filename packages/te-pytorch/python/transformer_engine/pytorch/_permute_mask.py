"""The mask-map permutation behind moe_permute(map_type="mask"), moe_permute_with_probs,
moe_permute_and_pad_with_probs and moe_unpermute(map_type="mask").

Plain torch ops (gather, scatter, index_add, cumsum, sort) in autograd Functions: the same
code runs on the CPU and on CUDA, and under torch.compile(fullgraph=True) (no host sync, no
data-dependent shape: the permuted row count is the caller's num_out_tokens).

Layout, as the reference's: the permuted buffer is expert-major (every token of expert 0 in
token order, then expert 1, ...), so the route (t, e) goes to row
    dst(t, e) = #routes of experts < e  +  #tokens t' < t routed to e
(plus pad_offsets[e] when padding is fused). row_id_map is int32 [num_tokens, 2 E + 1]:
for token t with n = row_id_map[t, 2E] kept routes, row_id_map[t, :n] are their
destination rows and row_id_map[t, E:E + n] their experts, in descending row order (the
reference's kernel sorts them so); the unused entries are -1 (the reference leaves them
unwritten).
"""

from __future__ import annotations

import torch


def make_row_id_map(routing_map: torch.Tensor, num_out_tokens: int) -> torch.Tensor:
    """row_id_map of a [num_tokens, num_experts] routing mask (any nonzero entry routes).

    A route whose destination row is >= num_out_tokens is dropped (left out of the map), the
    rule the index map's kernel applies to num_out_tokens smaller than the routed count; the
    reference's mask-map kernel writes such rows out of bounds instead.
    """
    num_tokens, num_experts = routing_map.shape
    mask = routing_map != 0
    # Expert-major running count: the flattened [E, T] cumsum numbers every route.
    flat = mask.T.reshape(-1).to(torch.int64)
    dst = (torch.cumsum(flat, 0) - 1).view(num_experts, num_tokens).T
    kept = mask & (dst < num_out_tokens)
    # Kept routes first, by descending expert (= descending row): a stable sort of the
    # expert-reversed "not kept" flags.
    order = torch.sort((~kept.flip(1)).to(torch.int8), dim=1, stable=True).indices
    experts = (num_experts - 1) - order
    n_kept = kept.sum(1, keepdim=True)
    unused = torch.arange(num_experts, device=routing_map.device) >= n_kept
    rows = torch.where(unused, -1, dst.gather(1, experts))
    experts = torch.where(unused, -1, experts)
    return torch.cat([rows, experts, n_kept], dim=1).to(torch.int32)


def row_owners(
    row_id_map: torch.Tensor, pad_offsets: torch.Tensor | None, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of the num_rows permuted rows: its token (num_tokens where no route lands
    there: padding rows, rows past the routed count) and its expert (0 there), int64."""
    num_tokens = row_id_map.size(0)
    num_experts = (row_id_map.size(1) - 1) // 2
    device = row_id_map.device
    dst = row_id_map[:, :num_experts].to(torch.int64)
    experts = row_id_map[:, num_experts : 2 * num_experts].to(torch.int64)
    used = torch.arange(num_experts, device=device) < row_id_map[:, 2 * num_experts :]
    experts = torch.where(used, experts, 0)
    if pad_offsets is not None:
        dst = dst + pad_offsets.to(device=device, dtype=torch.int64)[experts]
    used = used & (dst >= 0) & (dst < num_rows)
    # Unused entries all scatter into one extra slot, cut off afterwards.
    slot = torch.where(used, dst, num_rows).reshape(-1)
    tokens = torch.arange(num_tokens, device=device).unsqueeze(1).expand(-1, num_experts).reshape(-1)
    token_of_row = torch.full((num_rows + 1,), num_tokens, dtype=torch.int64, device=device)
    token_of_row = token_of_row.scatter(0, slot, tokens)[:num_rows]
    expert_of_row = torch.zeros(num_rows + 1, dtype=torch.int64, device=device)
    expert_of_row = expert_of_row.scatter(0, slot, experts.reshape(-1))[:num_rows]
    return token_of_row, expert_of_row


def _gather_tokens(x: torch.Tensor, token_of_row: torch.Tensor) -> torch.Tensor:
    """x[token_of_row] with zero rows where token_of_row is the num_tokens sentinel."""
    num_tokens = x.size(0)
    if num_tokens == 0:
        return x.new_zeros((token_of_row.numel(), *x.shape[1:]))
    owned = (token_of_row < num_tokens).unsqueeze(1)
    return torch.where(owned, x[token_of_row.clamp(max=num_tokens - 1)], 0)


def _pick(table: torch.Tensor, token_of_row: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
    """table[token, expert] per permuted row ([num_tokens, num_experts] table), 0 where unowned."""
    num_tokens = table.size(0)
    if num_tokens == 0:
        return table.new_zeros(token_of_row.shape)
    owned = token_of_row < num_tokens
    return torch.where(owned, table[token_of_row.clamp(max=num_tokens - 1), expert_of_row], 0)


def _sum_into_tokens(x: torch.Tensor, token_of_row: torch.Tensor, num_tokens: int, dtype) -> torch.Tensor:
    """Sum of the permuted rows of each token, accumulated in FP32 and rounded once to dtype:
    the reference's unpermute kernel accumulates in FP32 too. (Its order is the row_id_map's,
    descending rows; index_add's may differ, which can move the FP32 sum by an ulp before
    the final rounding.)"""
    acc = torch.zeros((num_tokens + 1, x.size(1)), dtype=torch.float32, device=x.device)
    return acc.index_add(0, token_of_row, x.float())[:num_tokens].to(dtype)


def _scatter_table(values, token_of_row, expert_of_row, num_tokens, num_experts) -> torch.Tensor:
    """A [num_tokens, num_experts] table with values[r] at (token, expert) of row r, 0 elsewhere."""
    flat = torch.zeros((num_tokens + 1) * num_experts, dtype=values.dtype, device=values.device)
    flat = flat.index_add(0, token_of_row * num_experts + expert_of_row, values)
    return flat[: num_tokens * num_experts].view(num_tokens, num_experts)


class PermuteMask(torch.autograd.Function):
    """(inp, routing_map, num_out_tokens, probs, pad_offsets) -> (output, row_id_map, permuted_probs)."""

    @staticmethod
    def forward(ctx, inp, routing_map, num_out_tokens, probs, pad_offsets):
        row_id_map = make_row_id_map(routing_map, num_out_tokens)
        token_of_row, expert_of_row = row_owners(row_id_map, pad_offsets, num_out_tokens)
        output = _gather_tokens(inp, token_of_row)
        permuted_probs = None
        if probs is not None:
            permuted_probs = _pick(probs, token_of_row, expert_of_row)
            # As the reference's kernel: a routed slot whose prob is exactly 0 (Megatron's
            # padded routing map under drop-and-pad) gets a zero row. Its backward still
            # passes that row's gradient to the token, as the reference's does.
            output = torch.where((permuted_probs == 0).unsqueeze(1), 0, output)
        ctx.mark_non_differentiable(row_id_map)
        ctx.save_for_backward(token_of_row, expert_of_row)
        ctx.shape = routing_map.shape
        return output, row_id_map, permuted_probs

    @staticmethod
    def backward(ctx, grad_output, _grad_row_id_map, grad_permuted_probs):
        token_of_row, expert_of_row = ctx.saved_tensors
        num_tokens, num_experts = ctx.shape
        grad_inp = grad_probs = None
        if ctx.needs_input_grad[0]:
            grad_inp = _sum_into_tokens(grad_output, token_of_row, num_tokens, grad_output.dtype)
        if ctx.needs_input_grad[3] and grad_permuted_probs is not None:
            grad_probs = _scatter_table(grad_permuted_probs, token_of_row, expert_of_row, num_tokens, num_experts)
        return grad_inp, None, None, grad_probs, None


class UnpermuteMask(torch.autograd.Function):
    """(inp, row_id_map, merging_probs, pad_offsets) -> [num_tokens, hidden]: each token's
    permuted rows summed (weighted by merging_probs[token, expert] when given)."""

    @staticmethod
    def forward(ctx, inp, row_id_map, merging_probs, pad_offsets):
        num_tokens = row_id_map.size(0)
        token_of_row, expert_of_row = row_owners(row_id_map, pad_offsets, inp.size(0))
        rows = inp.float()
        if merging_probs is not None:
            # FP32 product, FP32 accumulation, one rounding: the reference kernel's order.
            weight = _pick(merging_probs, token_of_row, expert_of_row).float()
            rows = rows * weight.unsqueeze(1)
        ctx.save_for_backward(inp if merging_probs is not None else None, merging_probs, token_of_row, expert_of_row)
        return _sum_into_tokens(rows, token_of_row, num_tokens, inp.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        inp, merging_probs, token_of_row, expert_of_row = ctx.saved_tensors
        rows = _gather_tokens(grad_out, token_of_row)
        grad_probs = None
        if merging_probs is None:
            return rows, None, None, None
        weight = _pick(merging_probs, token_of_row, expert_of_row).float()
        grad_inp = (rows.float() * weight.unsqueeze(1)).to(grad_out.dtype)
        if ctx.needs_input_grad[2]:
            # d out[t] / d prob[t, e] = inp[row(t, e)], reduced in FP32 as the reference does.
            dots = (inp.float() * rows.float()).sum(1)
            grad_probs = _scatter_table(dots, token_of_row, expert_of_row, *merging_probs.shape)
            grad_probs = grad_probs.to(merging_probs.dtype)
        return grad_inp, None, grad_probs, None
