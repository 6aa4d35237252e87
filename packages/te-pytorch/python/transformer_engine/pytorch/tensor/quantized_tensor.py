"""Base classes of the quantized tensors and their quantizers.

A Quantizer turns a high-precision tensor into a QuantizedTensor of one
format (per-tensor FP8 today; MXFP8, FP8 block and NVFP4 plug in as further
subclasses). A QuantizedTensor is a torch.Tensor subclass whose nominal dtype
is the high-precision type it stands for. Ops it does not implement exactly
run on its dequantized value (so any torch code keeps working, in high
precision); in-place ops requantize the result into the tensor.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import torch
from torch.utils._pytree import tree_map


class Quantizer:
    """Builds quantized tensors of one format.

    rowwise / columnwise: which copies quantize() produces. The rowwise copy
    has the tensor's layout; the columnwise copy is what the transposed GEMM
    operand needs (for per-tensor FP8 on Hopper: the [K, M] transpose of the
    tensor viewed as a matrix [M, K]).
    internal: kept for API compatibility (the reference returns storage
    objects instead of torch subclasses when True); modules here use the
    kernels directly instead.
    """

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True) -> None:
        self.rowwise_usage = rowwise
        self.columnwise_usage = columnwise
        self.internal = False

    def set_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        if rowwise is not None:
            self.rowwise_usage = rowwise
        if columnwise is not None:
            self.columnwise_usage = columnwise

    def __call__(self, tensor: torch.Tensor) -> QuantizedTensor:
        return self.quantize(tensor)

    def quantize(self, tensor: torch.Tensor, *, out: QuantizedTensor | None = None):
        """A new quantized tensor; with `out`, quantize into it in place instead.

        Differentiable: the gradient passes through unchanged (straight-through).
        """
        if out is not None:
            return self.update_quantized(tensor, out)
        if tensor.requires_grad and torch.is_grad_enabled():
            return _StraightThrough.apply(tensor, self._quantize)
        return self._quantize(tensor)

    def _quantize(self, tensor: torch.Tensor) -> QuantizedTensor:
        raise NotImplementedError

    def update_quantized(
        self, src: torch.Tensor, dst: QuantizedTensor, *, noop_flag: torch.Tensor | None = None
    ) -> QuantizedTensor:
        raise NotImplementedError

    def make_empty(
        self, shape, *, dtype: torch.dtype = torch.float32, device=None, requires_grad: bool = False
    ) -> QuantizedTensor:
        raise NotImplementedError

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Record statistics of `tensor` without quantizing it (default: nothing)."""

    def copy(self) -> Quantizer:
        return copy.copy(self)


class _StraightThrough(torch.autograd.Function):
    """fn(tensor) whose gradient passes through unchanged (quantize / dequantize)."""

    @staticmethod
    def forward(ctx, tensor, fn):
        return fn(tensor)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _dequantize_arg(value):
    return value.dequantize() if isinstance(value, QuantizedTensor) else value


class QuantizedTensor(torch.Tensor):
    """A quantized tensor; its dtype is the nominal (high-precision) dtype.

    Subclasses implement ``_dequantize``, ``quantize_``'s storage update through their
    quantizer, and exact handlers for the ops that do not need the values
    (detach, views, ...), registered in their HANDLERS dict.
    """

    HANDLERS: ClassVar[dict] = {}
    _quantizer: Quantizer | None

    # Plain torch.Tensor methods and torch functions go straight to dispatch.
    __torch_function__ = torch._C._disabled_torch_function_impl

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The high-precision value (self.dtype unless dtype is given)."""
        dtype = self.dtype if dtype is None else dtype
        if self.requires_grad and torch.is_grad_enabled():
            return _StraightThrough.apply(self, lambda t: t._dequantize(dtype))
        return self._dequantize(dtype)

    def _dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def quantize_(self, tensor: torch.Tensor, *, noop_flag: torch.Tensor | None = None):
        """Quantize `tensor` into self in place (skipped when noop_flag == 1)."""
        if self._quantizer is None:
            raise RuntimeError(f"{type(self).__name__} has no quantizer to requantize with")
        if isinstance(tensor, QuantizedTensor):
            tensor = tensor.dequantize()
        self._quantizer.update_quantized(tensor, self, noop_flag=noop_flag)
        return self

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = cls.HANDLERS.get(func)
        if handler is not None:
            result = handler(func, args, kwargs)
            if result is not NotImplemented:
                return result
        # In-place op on a quantized tensor: compute in high precision, then
        # requantize into the tensor (its storage objects are kept).
        if func._schema.is_mutable and args and isinstance(args[0], QuantizedTensor):
            target = args[0]
            value = target.dequantize()
            func(value, *tree_map(_dequantize_arg, args[1:]), **tree_map(_dequantize_arg, kwargs))
            target.quantize_(value)
            return target
        # Anything else runs on the dequantized values.
        return func(*tree_map(_dequantize_arg, args), **tree_map(_dequantize_arg, kwargs))

    def __repr__(self, *, tensor_contents=None) -> str:
        try:
            data = self._dequantize(self.dtype)
        except (AttributeError, TypeError, ValueError):  # cleared buffers
            data = "<no data>"
        return f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}, data={data})"
