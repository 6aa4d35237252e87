"""Collectives along the outer dimension over torch.distributed: AllReduce,
AllGather and ReduceScatter (each the other's transpose in backward).

Over a group of one process they are identities. Backends without a native
reduce-scatter (gloo) get it as an all-reduce and a slice: the same values.
"""

from __future__ import annotations

import torch

from .._common import maybe_dequantize
from ..op import BasicOperation

__all__ = ["AllGather", "AllReduce", "ReduceScatter"]


def _gather(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """Concatenation along dim 0 of every process's x."""
    x = maybe_dequantize(x).contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    torch.distributed.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=0)


def _reduce_scatter(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """This process's slice along dim 0 of the sum of every process's x."""
    dist = torch.distributed
    if not x.shape or x.shape[0] % size:
        raise RuntimeError(f"Attempted to reduce-scatter a tensor with shape={list(x.shape)} over {size} processes")
    x = maybe_dequantize(x).contiguous()
    rows = x.shape[0] // size
    if dist.get_backend(group) == "nccl":
        out = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(out, x, group=group)
        return out
    total = x.clone()
    dist.all_reduce(total, group=group)
    rank = dist.get_rank(group)
    return total[rank * rows : (rank + 1) * rows].contiguous()


class AllReduce(BasicOperation):
    """Sums the tensor over the processes of ``process_group`` (default: the
    world group). The output is assumed to feed computations repeated on every
    process, so the gradient is passed through unchanged.

    Args:
        process_group: torch.distributed.ProcessGroup, optional.
        reduce_in_backward: bool, default = True. Kept for the reference's signature (its backward is the identity
            too).
    """

    def __init__(self, process_group=None, reduce_in_backward: bool = True) -> None:
        super().__init__()
        self.process_group = process_group
        self._reduce_in_backward = reduce_in_backward

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        if torch.distributed.get_world_size(self.process_group) == 1:
            return input_
        x = maybe_dequantize(input_).contiguous().clone()
        torch.distributed.all_reduce(x, group=self.process_group)
        return x

    def op_backward(self, ctx, grad_output):
        return grad_output, ()


class _OuterDimCollective(BasicOperation):
    """A collective along dim 0 over ``process_group`` (default: the world group)."""

    def __init__(self, process_group=None) -> None:
        super().__init__()
        self.process_group = process_group
        self.process_group_size = torch.distributed.get_world_size(process_group)


class AllGather(_OuterDimCollective):
    """Gathers the tensor from every process of ``process_group`` and concatenates
    along the first dimension (backward: reduce-scatter of the gradient)."""

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        if self.process_group_size == 1:
            return input_.detach()
        return _gather(input_, self.process_group, self.process_group_size)

    def op_backward(self, ctx, grad_output):
        if self.process_group_size == 1:
            return grad_output, ()
        return _reduce_scatter(grad_output, self.process_group, self.process_group_size), ()


class ReduceScatter(_OuterDimCollective):
    """Sums the tensor over the processes of ``process_group`` and keeps this
    process's slice along the first dimension (backward: all-gather)."""

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer=None, next_op_input_quantizer=None):
        if self.process_group_size == 1:
            return input_.detach()
        return _reduce_scatter(input_, self.process_group, self.process_group_size)

    def op_backward(self, ctx, grad_output):
        if self.process_group_size == 1:
            return grad_output.detach(), ()
        return _gather(grad_output, self.process_group, self.process_group_size), ()
