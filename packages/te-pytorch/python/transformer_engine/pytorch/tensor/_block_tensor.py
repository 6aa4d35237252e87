"""Shared machinery of the block-scaled tensors (MXFP8Tensor,
Float8BlockwiseQTensor, NVFP4Tensor).

Each subclass declares BUFFERS (its tensor fields, e.g. rowwise_data) and
META (its plain fields, e.g. fp8_dtype); both are constructor keywords and
are stored as attributes with a leading underscore (_rowwise_data, ...).
This file gives them, generically: the constructor, detach/alias, clone,
moves between devices, copy_ (requantizes), pickling (torch.save/torch.load
round-trip every byte), and the quantizer base (quantize / quantize_ /
make_empty). Any other op runs on the dequantized value (quantized_tensor.py).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .quantized_tensor import QuantizedTensor, Quantizer

aten = torch.ops.aten


class BlockQuantizedTensor(QuantizedTensor):
    """Base of the block-scaled tensors; see the module docstring."""

    HANDLERS: ClassVar[dict] = {}
    BUFFERS: ClassVar[tuple] = ()
    META: ClassVar[tuple] = ()

    @staticmethod
    def __new__(cls, shape, dtype, *, quantizer=None, requires_grad=False, **fields):
        unknown = set(fields) - set(cls.BUFFERS) - set(cls.META)
        if unknown:
            raise TypeError(f"{cls.__name__}: unexpected arguments {sorted(unknown)}")
        buffers = [fields.get(name) for name in cls.BUFFERS]
        source = next((b for b in buffers if b is not None), None)
        if source is None:
            raise ValueError(f"{cls.__name__} needs rowwise or columnwise data")
        self = torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=dtype, device=source.device, requires_grad=requires_grad
        )
        for name in cls.BUFFERS + cls.META:
            setattr(self, "_" + name, fields.get(name))
        self._quantizer = quantizer
        return self

    def fields(self) -> dict:
        return {name: getattr(self, "_" + name) for name in self.BUFFERS + self.META}

    def _like(self, fn, *, keep_quantizer: bool = True):
        """A tensor of the same kind with fn applied to each buffer."""
        fields = self.fields()
        for name in self.BUFFERS:
            if fields[name] is not None:
                fields[name] = fn(fields[name])
        return type(self)(self.shape, self.dtype, quantizer=self._quantizer if keep_quantizer else None, **fields)

    def has(self, columnwise: bool) -> bool:
        return getattr(self, "_columnwise_data" if columnwise else "_rowwise_data") is not None

    def update_usage(self, *, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drops a copy that is no longer needed (block formats cannot rebuild a 1-D
        columnwise copy from the rowwise one: requantize instead)."""
        for usage, prefix in ((rowwise_usage, "_rowwise"), (columnwise_usage, "_columnwise")):
            if usage is False:
                other = "_columnwise_data" if prefix == "_rowwise" else "_rowwise_data"
                if getattr(self, other) is None:
                    raise ValueError(f"cannot drop the only copy ({prefix[1:]}) of this tensor")
                for name in self.BUFFERS:
                    if name.startswith(prefix[1:]):
                        setattr(self, "_" + name, None)
            elif usage and not self.has(prefix == "_columnwise"):
                raise ValueError(f"this tensor has no {prefix[1:]} copy; requantize with the quantizer")

    def clear(self) -> None:
        for name in self.BUFFERS:
            setattr(self, "_" + name, None)

    def get_metadata(self) -> dict:
        return {**self.fields(), "quantizer": self._quantizer}

    def __reduce_ex__(self, protocol):
        return (_rebuild_block_tensor, (type(self), tuple(self.shape), self.dtype, self.fields(), self.requires_grad))


def _rebuild_block_tensor(cls, shape, dtype, fields, requires_grad):
    """Rebuilds a pickled block tensor (a safe global for weights_only loads).
    The quantizer is not saved (it may hold process groups); quantize_ needs a new one."""
    return cls(shape, dtype, requires_grad=requires_grad, **fields)


def _handles(*funcs):
    def register(fn):
        for func in funcs:
            BlockQuantizedTensor.HANDLERS[func] = fn
        return fn

    return register


@_handles(aten.detach.default, aten.alias.default)
def _detach(func, args, kwargs):
    return args[0]._like(lambda b: b)


@_handles(aten.clone.default)
def _clone(func, args, kwargs):
    return args[0]._like(torch.clone)


@_handles(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    t = args[0]
    dtype = kwargs.get("dtype", t.dtype)
    device = kwargs.get("device", t.device)
    if dtype != t.dtype:
        return t._dequantize(dtype).to(device)
    return t._like(lambda b: b.to(device), keep_quantizer=False)


@_handles(aten.copy_.default)
def _copy(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, BlockQuantizedTensor):
        if type(src) is type(dst) and src.shape == dst.shape and all(src.has(c) for c in (False, True) if dst.has(c)):
            _copy_fields(dst, src)
        else:
            dst.quantize_(src)
        return dst
    dst.copy_(src.dequantize())
    return dst


def _copy_fields(dst: BlockQuantizedTensor, src: BlockQuantizedTensor) -> None:
    """dst = src exactly (same format): every buffer and setting is copied, in
    place where the old buffer fits (load_state_dict round-trips exactly)."""
    for name in dst.BUFFERS:
        old, new = getattr(dst, "_" + name), getattr(src, "_" + name)
        if new is not None and old is not None and old.shape == new.shape:
            old.copy_(new)
        else:
            setattr(dst, "_" + name, None if new is None else new.to(dst.device, copy=True))
    for name in dst.META:
        setattr(dst, "_" + name, getattr(src, "_" + name))


class BlockQuantizer(Quantizer):
    """Base of the block quantizers. Subclasses give TENSOR (their tensor class),
    KIND (the operand kind of module/_operand.py) and quantize_fields(x, rowwise,
    columnwise) -> the tensor's fields."""

    TENSOR: ClassVar[type] = BlockQuantizedTensor

    def quantize_fields(self, x: torch.Tensor, rowwise: bool, columnwise: bool) -> dict:
        raise NotImplementedError

    def _quantize(self, tensor):
        fields = self.quantize_fields(tensor, self.rowwise_usage, self.columnwise_usage)
        return self.TENSOR(tensor.shape, tensor.dtype, quantizer=self, **fields)

    def update_quantized(self, src, dst, *, noop_flag=None):
        if noop_flag is not None and bool(noop_flag.reshape(-1)[0] == 1):
            return dst
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(f"cannot quantize a tensor of shape {tuple(src.shape)} into one of {tuple(dst.shape)}")
        rowwise, columnwise = dst.has(False), dst.has(True)
        fields = self.quantize_fields(src.to(dst.dtype), rowwise or not columnwise, columnwise)
        for name, new in fields.items():
            old = getattr(dst, "_" + name)
            # In place where the old buffer fits (views and CUDA-graph pointers stay valid).
            if isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor) and old.shape == new.shape:
                old.copy_(new)
            else:
                setattr(dst, "_" + name, new)
        return dst

    def make_empty(self, shape, *, dtype=torch.float32, device=None, requires_grad=False):
        # The buffers' shapes come from quantizing zeros (a one-off cost at allocation).
        zeros = torch.zeros(tuple(shape), dtype=dtype, device=device)
        fields = self.quantize_fields(zeros, self.rowwise_usage, self.columnwise_usage)
        return self.TENSOR(tuple(shape), dtype, quantizer=self, requires_grad=requires_grad, **fields)
