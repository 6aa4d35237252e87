"""Helpers every fusible operation shares: quantized-tensor checks, the
compute dtype, and the constructors' device / dtype defaults.

(Megatron-Core imports is_quantized_tensor from here, as in the reference.)
"""

from __future__ import annotations

import torch

from ..module._args import PARAMS_DTYPES
from ..module.base import resolve_device
from ..tensor import QuantizedTensor


def is_quantized_tensor(tensor) -> bool:
    """Whether `tensor` is one of te-pytorch's quantized tensors (Float8Tensor, MXFP8Tensor, ...)."""
    return isinstance(tensor, QuantizedTensor)


def maybe_dequantize(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`tensor` as a plain tensor of `dtype` (default: its own nominal dtype);
    a quantized tensor is dequantized, a plain one cast only when needed."""
    if isinstance(tensor, QuantizedTensor):
        return tensor.dequantize(dtype=dtype)
    if dtype is not None and tensor.dtype != dtype:
        return tensor.to(dtype)
    return tensor


def maybe_autocast_dtype(*, device_type: str = "cuda", default_dtype: torch.dtype | None = None) -> torch.dtype:
    """torch.autocast's dtype on `device_type` when it is on, else `default_dtype`
    (None: torch's default dtype)."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.get_default_dtype() if default_dtype is None else default_dtype


def compute_dtype(like: torch.Tensor, default_dtype: torch.dtype) -> torch.dtype:
    """The dtype an op computes in for an input on like's device: torch.autocast's
    there, else `default_dtype`; refused unless the kernels take it."""
    dtype = maybe_autocast_dtype(device_type=like.device.type, default_dtype=default_dtype)
    if dtype not in PARAMS_DTYPES:
        raise TypeError(f"te.ops: unsupported compute dtype {dtype}; use float32, bfloat16 or float16")
    return dtype


def canonicalize_device(device, owner: str) -> torch.device:
    """The device a constructor allocates on: None is the default device (the
    current CUDA device, else the CPU with a one-time warning), "meta" stays
    meta (parameters materialized at the first forward)."""
    if device is not None and torch.device(device).type == "meta":
        return torch.device("meta")
    return resolve_device(device, owner)


def canonicalize_dtype(dtype, owner: str) -> torch.dtype:
    """None is torch's default dtype; parameters are FP32, BF16 or FP16."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype not in PARAMS_DTYPES:
        raise ValueError(f"{owner}: supported dtypes are float32, float16, bfloat16 (got {dtype})")
    return dtype


def reject_tensor_parallel(owner: str, group) -> None:
    """Tensor parallelism over more than one rank is not implemented yet."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) == 1:
        return
    raise NotImplementedError(
        f"{owner}: tensor parallelism (tensor_parallel_mode / tensor_parallel) over more than one rank is not "
        "yet supported by transformer_engine.pytorch.ops; leave it at its default or use a group of one rank"
    )
