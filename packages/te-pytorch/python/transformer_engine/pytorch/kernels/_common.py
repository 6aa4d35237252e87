"""torch tensors -> te-core descriptors, streams and workspaces.

Every kernel wrapper in this package goes through these helpers, so the torch
-> core mapping lives in one place:

- A descriptor is lib.TensorDesc(data_ptr, dtype_code, shape, device_type,
  device_index); device_type is 0 for CPU and 1 for CUDA. FP8 data lives in
  torch.uint8 tensors and its format code is passed explicitly (DLPack and
  older torch builds have no portable FP8 dtype).
- The stream is the current torch CUDA stream of the tensor's device (0 on
  the CPU, where the core ignores it), so the core's kernels order with
  torch's.
- The core never allocates: workspaces come from torch's caching allocator,
  one cached buffer per (device, stream) that only grows. Keeping one per
  stream means two streams never share scratch memory.

Host overhead matters (small FP8 layers are launch-bound), so these helpers
avoid Python work: the shape is passed as torch.Size (nanobind reads it as a
sequence, several times faster than building a list) and dtype codes are dict
lookups. Descriptors of long-lived tensors (quantizer scales and amaxes,
delayed-scaling states, workspaces) are built once and cached by their owner;
a descriptor is a raw pointer, so whoever builds one must keep the tensor
(and any contiguous copy) alive until the core call returns.
"""

from __future__ import annotations

import torch

from transformer_engine.core import DType, lib

FLOAT32, FLOAT16, BFLOAT16 = int(DType.kFloat32), int(DType.kFloat16), int(DType.kBFloat16)
BYTE, E4M3, E5M2 = int(DType.kByte), int(DType.kFloat8E4M3), int(DType.kFloat8E5M2)
FP8_CODES = (E4M3, E5M2)

TORCH_TO_CODE = {
    torch.float32: FLOAT32,
    torch.float16: FLOAT16,
    torch.bfloat16: BFLOAT16,
    torch.uint8: BYTE,
    torch.float8_e4m3fn: E4M3,
    torch.float8_e5m2: E5M2,
}


def code_of(t: torch.Tensor, name: str) -> int:
    """The core dtype code of a high-precision (or torch float8) tensor."""
    code = TORCH_TO_CODE.get(t.dtype)
    if code is None or code == BYTE:
        raise TypeError(f"argument '{name}' must be float32, bfloat16 or float16, got {t.dtype}")
    return code


def desc(t: torch.Tensor, code: int) -> lib.TensorDesc:
    """Descriptor of a contiguous tensor with an explicit dtype code."""
    index = t.get_device()  # (an int: cheaper than t.device.index, which builds a torch.device)
    if index >= 0:
        return lib.TensorDesc(t.data_ptr(), code, t.shape, 1, index)
    return lib.TensorDesc(t.data_ptr(), code, t.shape, 0, 0)


def hp_desc(t: torch.Tensor, name: str) -> lib.TensorDesc:
    """Descriptor of a high-precision tensor (its code from its torch dtype)."""
    return desc(t, code_of(t, name))


def scalar_desc(base: torch.Tensor, index: int) -> lib.TensorDesc:
    """Descriptor of the FP32 element base[index] of a contiguous FP32 tensor,
    made by pointer arithmetic: no torch view is created (saves host time when
    several scalars share one allocation)."""
    ptr = base.data_ptr() + 4 * index
    device = base.get_device()
    if device >= 0:
        return lib.TensorDesc(ptr, FLOAT32, (), 1, device)
    return lib.TensorDesc(ptr, FLOAT32, (), 0, 0)


def matrix_t_shape(shape) -> tuple:
    """[K, M]: the shape of the transposed ("columnwise") copy of a tensor
    viewed as a matrix [M, K] (K = last dim, M = product of the others)."""
    if len(shape) == 0:
        return (1, 1)
    cols = shape[-1]
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    return (cols, rows)


def stream_of(t: torch.Tensor) -> int:
    """The raw current CUDA stream of t's device, or 0 for a CPU tensor."""
    index = t.get_device()
    return torch._C._cuda_getCurrentRawStream(index) if index >= 0 else 0


def check_out_dtype(out_dtype) -> None:
    """A GEMM's D is float32, bfloat16 or float16."""
    if out_dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"argument 'out_dtype' must be float32, bfloat16 or float16, got {out_dtype}")


def check_accumulate_out(out: torch.Tensor, m: int, n: int) -> None:
    """The `out` of an accumulating GEMM: a contiguous tensor of m x n elements in a GEMM output dtype."""
    if out.numel() != m * n or not out.is_contiguous():
        got = tuple(out.shape)
        raise ValueError(f"argument 'out' must be a contiguous tensor of {m}x{n} elements, got shape {got}")
    check_out_dtype(out.dtype)


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


# (device index, stream) -> (buffer, its descriptor, its bytes). A buffer that is
# outgrown is kept alive in _RETIRED, never freed: a CUDA graph captured
# earlier may still point at it, and freed memory would be handed to other
# tensors while the graph's replays keep writing to it. With doubling growth
# the retired buffers add at most the size of the live one. Graphs captured
# on one stream share its workspace: replay them one after another (as on
# one stream), not concurrently on different streams.
_WORKSPACES: dict[tuple[int, int], tuple[torch.Tensor, lib.TensorDesc, int]] = {}  # (buffer, desc, bytes)
_RETIRED: list[torch.Tensor] = []


def workspace(nbytes: int, like: torch.Tensor, stream: int) -> lib.TensorDesc | None:
    """A byte workspace of at least nbytes on like's device, cached per (device, stream)."""
    if nbytes == 0:
        return None
    key = (like.get_device(), stream)
    cached = _WORKSPACES.get(key)
    if cached is not None and cached[2] >= nbytes:
        return cached[1]
    # Round up so that slightly different shapes do not reallocate each call.
    size = max(nbytes, 1 << 20)
    if cached is not None:
        size = max(size, 2 * cached[0].numel())
        _RETIRED.append(cached[0])
    buffer = torch.empty(size, dtype=torch.uint8, device=like.device)
    _WORKSPACES[key] = (buffer, desc(buffer, BYTE), size)
    return _WORKSPACES[key][1]


def compiling() -> bool:
    """True while torch.compile traces: then the registered torch.ops.te.* ops
    must be called (the tracer cannot look into nanobind calls); in eager mode
    the wrappers call the implementations directly, which skips the custom-op
    dispatcher (tens of microseconds per call)."""
    return torch.compiler.is_compiling()
