"""Core descriptors for torch tensors (benchmarks and GPU tests only; the core never imports torch)."""

from __future__ import annotations

import torch

from transformer_engine.core import DType, lib

TORCH_TO_TE = {
    torch.float32: DType.kFloat32,
    torch.bfloat16: DType.kBFloat16,
    torch.float16: DType.kFloat16,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
    torch.uint8: DType.kByte,
}


def desc(t: torch.Tensor) -> lib.TensorDesc:
    assert t.is_contiguous(), "descriptors need contiguous tensors"
    device_type = 1 if t.is_cuda else 0
    return lib.TensorDesc(t.data_ptr(), int(TORCH_TO_TE[t.dtype]), list(t.shape), device_type, t.device.index or 0)


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream
