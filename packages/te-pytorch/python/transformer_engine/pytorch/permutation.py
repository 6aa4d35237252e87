"""MoE token permutation: group the tokens by the experts they are routed to, and back.

The reference's API (``moe_permute``, ``moe_permute_with_probs``,
``moe_permute_and_pad_with_probs``, ``moe_unpermute``, ``moe_sort_chunks_by_index``,
``moe_sort_chunks_by_index_with_probs``) with its parameters, defaults, row_id_map layouts
and return tuples. Built from torch ops in autograd Functions (_permute_mask,
_permute_index): they run on the CPU and on CUDA, and under ``torch.compile(fullgraph=True)``
except ``moe_permute_and_pad_with_probs``, whose output size is read back from the device,
as in the reference.

Not supported: quantized (FP8) inputs, which the reference's mask map permutes as raw bytes
with their scales; pass the high-precision tensor and quantize after permuting.
"""

from __future__ import annotations

import warnings

import torch

from ._permute_index import PermuteIndex, SortChunks, UnpermuteIndex
from ._permute_mask import PermuteMask, UnpermuteMask
from .tensor import QuantizedTensor

__all__ = [
    "moe_permute",
    "moe_permute_with_probs",
    "moe_permute_and_pad_with_probs",
    "moe_unpermute",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
]


def _check_tokens(owner: str, inp) -> None:
    if isinstance(inp, QuantizedTensor):
        raise TypeError(
            f"{owner}: inp is a {type(inp).__name__}; quantized (FP8) inputs are not supported "
            "here yet. Permute the high-precision tensor and quantize the result."
        )
    if not isinstance(inp, torch.Tensor) or inp.dim() != 2:
        shape = tuple(inp.shape) if isinstance(inp, torch.Tensor) else type(inp).__name__
        raise ValueError(f"{owner}: inp must be a 2-D [num_tokens, hidden_size] tensor, got {shape}")


def _as_int(owner: str, name: str, value) -> int:
    # Megatron-Core passes counts as Python ints or as 0-dim tensors (tokens_per_expert.sum()).
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, got {value!r}")
    return value


def _check_map(owner: str, inp, routing_map, probs=None) -> None:
    if routing_map.dim() != 2 or routing_map.size(0) != inp.size(0):
        raise ValueError(
            f"{owner}: routing_map must be [num_tokens={inp.size(0)}, num_experts], got {tuple(routing_map.shape)}"
        )
    if probs is not None and probs.shape != routing_map.shape:
        raise ValueError(
            f"{owner}: probs must have routing_map's shape {tuple(routing_map.shape)}, got {tuple(probs.shape)}"
        )


def _mask_out_tokens(owner: str, inp, num_out_tokens) -> int:
    num_out_tokens = _as_int(owner, "num_out_tokens", num_out_tokens)
    if num_out_tokens <= 0 and inp.size(0) > 0:
        # The reference rejects it as well; the mask map needs the output size up front.
        raise ValueError(
            f"{owner}: num_out_tokens must be > 0 for the mask map, got {num_out_tokens} "
            "(use int(routing_map.sum()) or num_tokens * topk)"
        )
    return max(num_out_tokens, 0) if inp.size(0) > 0 else 0


def moe_permute(
    inp: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int,
    max_token_num: int = -1,
    map_type: str = "mask",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group the rows of ``inp`` [num_tokens, hidden] by expert.

    ``map_type="mask"``: ``routing_map`` is [num_tokens, num_experts] (nonzero: routed); the
    output has ``num_out_tokens`` (> 0) rows, expert-major, tokens in order within an
    expert; routes that land at row >= num_out_tokens are dropped. ``map_type="index"``:
    ``routing_map`` is [num_tokens, topk] expert indices; ``num_out_tokens`` >= 0 (0: all
    num_tokens * topk routes), the routes past it in expert order are dropped.
    ``max_token_num`` only sized the reference's workspace and is ignored.

    Returns ``(permuted, row_id_map)``; pass row_id_map to :func:`moe_unpermute` with the
    same map_type.
    """
    del max_token_num
    _check_tokens("moe_permute", inp)
    if map_type == "mask":
        _check_map("moe_permute", inp, routing_map)
        num_out = _mask_out_tokens("moe_permute", inp, num_out_tokens)
        output, row_id_map, _ = PermuteMask.apply(inp, routing_map, num_out, None, None)
        return output, row_id_map
    if map_type == "index":
        index = routing_map.unsqueeze(1) if routing_map.dim() == 1 else routing_map
        if index.dim() != 2 or index.size(0) != inp.size(0):
            raise ValueError(
                f"moe_permute: routing_map (index map) must be [num_tokens={inp.size(0)}, topk], "
                f"got {tuple(routing_map.shape)}"
            )
        num_out = _as_int("moe_permute", "num_out_tokens", num_out_tokens)
        if num_out < 0:
            raise ValueError(f"moe_permute: num_out_tokens must be >= 0 for the index map, got {num_out}")
        return PermuteIndex.apply(inp, index, num_out if num_out > 0 else index.numel())
    raise ValueError(f"moe_permute: map_type must be 'mask' or 'index', got {map_type!r}")


def moe_permute_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    num_out_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`moe_permute` (mask map) that also permutes ``probs`` [num_tokens, num_experts]:
    returns ``(permuted, permuted_probs [num_out_tokens], row_id_map)``.

    As in the reference, a routed slot whose prob is exactly 0 gets a zero row (the padded
    slots of a drop-and-pad routing map); gradients flow to ``inp`` and ``probs``.
    """
    _check_tokens("moe_permute_with_probs", inp)
    _check_map("moe_permute_with_probs", inp, routing_map, probs)
    num_out = _mask_out_tokens("moe_permute_with_probs", inp, num_out_tokens)
    output, row_id_map, permuted_probs = PermuteMask.apply(inp, routing_map, num_out, probs, None)
    return output, permuted_probs, row_id_map


def moe_permute_and_pad_with_probs(
    inp: torch.Tensor,
    probs: torch.Tensor,
    routing_map: torch.Tensor,
    tokens_per_expert: torch.Tensor,
    align_size: int,
):
    """:func:`moe_permute_with_probs` with each expert's rows padded up to a multiple of
    ``align_size`` (zero rows, prob 0), for GEMMs that need aligned row counts.

    ``tokens_per_expert`` [num_experts] is routing_map's column sums. Returns
    ``(permuted, permuted_probs, row_id_map, pad_offsets, padded_tokens_per_expert)``;
    pad_offsets [num_experts] (the padding rows before each expert, None when no expert
    needs any) goes to :func:`moe_unpermute`. The output size is read back from the device
    (a sync; a graph break under torch.compile), as in the reference.
    """
    owner = "moe_permute_and_pad_with_probs"
    _check_tokens(owner, inp)
    _check_map(owner, inp, routing_map, probs)
    if tokens_per_expert is None:
        raise ValueError(f"{owner}: tokens_per_expert must be given")
    if isinstance(align_size, bool) or not isinstance(align_size, int) or align_size <= 0:
        raise ValueError(f"{owner}: align_size must be a positive int, got {align_size!r}")
    if tokens_per_expert.numel() != routing_map.size(1):
        raise ValueError(
            f"{owner}: tokens_per_expert must have num_experts={routing_map.size(1)} entries, "
            f"got {tokens_per_expert.numel()}"
        )
    counts = tokens_per_expert.to(inp.device).reshape(-1)
    padded = (torch.ceil(counts / align_size) * align_size).long()
    if torch.equal(counts.long(), padded):
        pad_offsets = None
    else:
        pads = torch.cumsum(padded - counts.long(), 0)
        pad_offsets = torch.cat([pads.new_zeros(1), pads[:-1]])
    num_out = int(padded.sum().item())
    output, row_id_map, permuted_probs = PermuteMask.apply(inp, routing_map, num_out, probs, pad_offsets)
    return output, permuted_probs, row_id_map, pad_offsets, padded


def moe_unpermute(
    inp: torch.Tensor,
    row_id_map: torch.Tensor,
    merging_probs: torch.Tensor | None = None,
    restore_shape: torch.Size | None = None,
    map_type: str = "mask",
    probs: torch.Tensor | None = None,
    pad_offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Undo :func:`moe_permute`: sum each token's permuted rows, weighted by
    ``merging_probs`` when given ([num_tokens, num_experts] for the mask map,
    [num_tokens, topk] for the index map).

    Mask map: ``restore_shape`` is (num_tokens, hidden) (default: inp's shape, as in the
    reference); accumulation in FP32, one rounding to inp's dtype. ``pad_offsets`` is the
    fourth output of :func:`moe_permute_and_pad_with_probs`. Index map: accumulation in
    inp's dtype, probs rounded to it (the reference kernels' numerics); without
    merging_probs every route comes back as its own row ([topk * num_tokens, hidden],
    k-major), as in the reference. ``probs`` is the deprecated name of merging_probs.
    """
    _check_tokens("moe_unpermute", inp)
    if probs is not None:
        if merging_probs is not None:
            raise ValueError("moe_unpermute: both merging_probs and probs are given; probs is deprecated")
        warnings.warn("moe_unpermute: probs is deprecated, use merging_probs", DeprecationWarning, stacklevel=2)
        merging_probs = probs
    if map_type == "index":
        if pad_offsets is not None:
            raise ValueError("moe_unpermute: pad_offsets applies to the mask map only")
        if merging_probs is not None:
            if merging_probs.dim() != 2 or merging_probs.numel() != row_id_map.numel():
                raise ValueError(
                    f"moe_unpermute: merging_probs must be [num_tokens, topk] with num_tokens * topk = "
                    f"row_id_map.numel() = {row_id_map.numel()}, got {tuple(merging_probs.shape)}"
                )
            # The reference casts the probs to FP32 first (then its kernel to inp's dtype).
            merging_probs = merging_probs.to(torch.float32)
        return UnpermuteIndex.apply(inp, row_id_map.reshape(-1), merging_probs)
    if map_type == "mask":
        num_experts = (row_id_map.size(1) - 1) // 2 if row_id_map.dim() == 2 else -1
        if num_experts < 1 or row_id_map.size(1) != 2 * num_experts + 1:
            raise ValueError(
                f"moe_unpermute: row_id_map (mask map) must be [num_tokens, 2 * num_experts + 1], "
                f"got {tuple(row_id_map.shape)}"
            )
        num_tokens, hidden = tuple(restore_shape) if restore_shape is not None else tuple(inp.shape)
        if num_tokens != row_id_map.size(0) or hidden != inp.size(1):
            raise ValueError(
                f"moe_unpermute: restore_shape {(num_tokens, hidden)} does not match row_id_map's "
                f"{row_id_map.size(0)} tokens and inp's hidden size {inp.size(1)}"
            )
        if merging_probs is not None and merging_probs.shape != (num_tokens, num_experts):
            raise ValueError(
                f"moe_unpermute: merging_probs must be [num_tokens, num_experts] = {(num_tokens, num_experts)}, "
                f"got {tuple(merging_probs.shape)}"
            )
        return UnpermuteMask.apply(inp, row_id_map, merging_probs, pad_offsets)
    raise ValueError(f"moe_unpermute: map_type must be 'mask' or 'index', got {map_type!r}")


def _check_chunks(owner: str, inp, split_sizes, sorted_index) -> None:
    _check_tokens(owner, inp)
    if split_sizes.dim() != 1 or sorted_index.shape != split_sizes.shape:
        raise ValueError(
            f"{owner}: split_sizes and sorted_index must be 1-D of one length, got "
            f"{tuple(split_sizes.shape)} and {tuple(sorted_index.shape)}"
        )


def moe_sort_chunks_by_index(inp: torch.Tensor, split_sizes: torch.Tensor, sorted_index: torch.Tensor) -> torch.Tensor:
    """Split ``inp`` along dim 0 into chunks of ``split_sizes`` rows and concatenate them in
    the order ``sorted_index`` lists (rows past sum(split_sizes) stay in place)."""
    _check_chunks("moe_sort_chunks_by_index", inp, split_sizes, sorted_index)
    output, _ = SortChunks.apply(inp, split_sizes, sorted_index, None)
    return output


def moe_sort_chunks_by_index_with_probs(
    inp: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor, sorted_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`moe_sort_chunks_by_index` that moves ``probs`` [num_tokens] along:
    returns ``(output, permuted_probs)``."""
    _check_chunks("moe_sort_chunks_by_index_with_probs", inp, split_sizes, sorted_index)
    if probs.shape != (inp.size(0),):
        raise ValueError(
            f"moe_sort_chunks_by_index_with_probs: probs must be [num_tokens={inp.size(0)}], got {tuple(probs.shape)}"
        )
    return SortChunks.apply(inp, split_sizes, sorted_index, probs)
