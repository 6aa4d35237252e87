"""Shared pieces of the te_gemm tests on raw device buffers (the `device`
fixture): the buffers, transformer_engine.core.gemm on the test's device, and
the CUDA backend's terms of the reference bound."""

from __future__ import annotations

import core_device
import ml_dtypes
import numpy as np

import transformer_engine.core as tec
from transformer_engine.core import GemmOutput, lib
from transformer_engine.core.reference_gemm import is_fp8, reference

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
HIGH_PRECISION = [F32, BF16, F16]
FP8_PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]
TRANS = [(False, False), (False, True), (True, False), (True, True)]
DEVICE_ODD_SHAPES = [(1, 1, 1), (5, 7, 3), (33, 65, 17), (257, 515, 263)]  # (M, N, K)
DEVICE_FP8_SHAPES = [(16, 32, 48), (64, 48, 80), (272, 528, 272)]
# cuBLASLt applies non-power-of-two FP8 scales to the sum (see reference_gemm).
FP8_EXTRA_ROUNDINGS = 4
HALF_TYPES = (BF16, F16)


def fused_bias_rounding(out_dtype, bias, *, fp8_inputs=False, gelu=False, c=None):
    """The 16-bit type a fused cuBLASLt BIAS epilogue may round the product to
    before adding the bias, or None when the CUDA plan adds the bias in FP32.

    Mirrors core/src/gemm/cuda_plan.cpp: BIAS is fused with a 16-bit D when the
    bias has D's type; with an FP8 D (FP8 inputs, no C) when the bias is 16-bit
    (cuBLASLt's C type, which we treat as a possible intermediate). GELU is
    fused only with FP32 D, so a GELU GEMM never takes this term.
    """
    if bias is None or gelu:
        return None
    out_dtype, bias_dtype = np.dtype(out_dtype), np.asarray(bias).dtype
    if out_dtype in HALF_TYPES and bias_dtype == out_dtype:
        return out_dtype
    if is_fp8(out_dtype) and fp8_inputs and c is None and bias_dtype in HALF_TYPES:
        return bias_dtype
    return None


def device_reference(a, b, *, out_dtype=F32, **kwargs):
    """reference_gemm.reference with, on CUDA, the CUDA backend's terms: the FP8
    tensor-core accumulation model (applies when both operands are FP8) and
    the fused-BIAS rounding of `fused_bias_rounding`; on the CPU, the plain reference."""
    if core_device.current() == "cpu":
        return reference(a, b, **kwargs)
    c = kwargs.get("c") if kwargs.get("beta", 0.0) != 0.0 else None  # te_gemm drops C at beta 0
    rounding = fused_bias_rounding(
        out_dtype, kwargs.get("bias"), gelu=kwargs.get("gelu", False), fp8_inputs=is_fp8(np.asarray(a).dtype), c=c
    )
    return reference(a, b, tensor_core_fp8=True, rounded_before_bias=rounding, **kwargs)


class DeviceArray:
    """A NumPy array's bytes on the test's device (optionally at a byte offset),
    with its te descriptor. The buffer starts zeroed (one spare byte)."""

    def __init__(self, shape, dtype, data=None, offset_bytes: int = 0):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.offset = offset_bytes
        self.buffer = core_device.Buffer(self.nbytes + offset_bytes + 1, fill=0)
        if data is not None:
            self.buffer.write(self.offset, np.ascontiguousarray(data, dtype=self.dtype))

    @classmethod
    def of(cls, array, offset_bytes: int = 0) -> DeviceArray:
        array = np.asarray(array)
        return cls(array.shape, array.dtype, array, offset_bytes)

    @property
    def storage(self):
        """The backing store: a NumPy array on the CPU, a torch tensor on CUDA."""
        return self.buffer.storage

    def bytes(self):
        return self.storage[self.offset : self.offset + self.nbytes]

    def typed(self, torch_dtype):
        """(CUDA) the bytes as a torch tensor of torch_dtype and this shape."""
        return self.bytes().view(torch_dtype).view(self.shape)

    def desc(self):
        return self.buffer.desc(self.offset, int(tec.te_dtype(self.dtype)), self.shape)

    def numpy(self) -> np.ndarray:
        self.buffer.sync()
        return self.buffer.read(self.offset, self.nbytes).view(self.dtype).reshape(self.shape)


def device_gemm(
    a,
    b,
    *,
    transa=False,
    transb=False,
    a_scale_inv=None,
    b_scale_inv=None,
    c=None,
    alpha=1.0,
    beta=0.0,
    bias=None,
    gelu=False,
    bias_grad=False,
    out_dtype=F32,
    d_scale=None,
    use_split_accumulator=True,
    pre_gelu_dtype=None,
    bias_grad_dtype=None,
    amax_start=0.0,
    c_in_place=False,
    offset_bytes=0,
    stream=None,
) -> GemmOutput:
    """transformer_engine.core.gemm on the test's device (same arguments, NumPy in and out;
    `stream`: a torch CUDA stream, CUDA only)."""
    a, b = np.asarray(a), np.asarray(b)
    out_dtype = np.dtype(out_dtype)
    m = a.shape[-1] if transa else int(np.prod(a.shape[:-1]))
    n = b.shape[0] if transb else b.shape[-1]
    side = out_dtype if not is_fp8(out_dtype) else F32
    keep = []  # every buffer stays alive until the GEMM has finished

    def device(array=None, shape=None, dtype=None, offset=0):
        if array is None:
            x = DeviceArray(shape, dtype, offset_bytes=offset)
        else:
            x = DeviceArray.of(array, offset)
        keep.append(x)
        return x

    def scalar_desc(value):
        return None if value is None else device(np.array(value, np.float32)).desc()

    da, db = device(a, offset=offset_bytes), device(b, offset=offset_bytes)
    if c_in_place:  # D starts as C and is updated in place
        d = device(np.asarray(c, out_dtype).reshape(m, n))
        dc = d
    else:
        d = device(shape=(m, n), dtype=out_dtype, offset=offset_bytes)
        dc = None if c is None else device(np.asarray(c).reshape(m, n))
    pre_dtype = side if pre_gelu_dtype is None else pre_gelu_dtype
    grad_dtype = side if bias_grad_dtype is None else bias_grad_dtype
    pre = device(shape=(m, n), dtype=pre_dtype) if gelu else None
    grad = device(shape=(m,), dtype=grad_dtype) if bias_grad else None
    amax = device(np.array(amax_start, np.float32)) if is_fp8(out_dtype) else None
    args = {
        "a_scale_inv": scalar_desc(a_scale_inv),
        "b_scale_inv": scalar_desc(b_scale_inv),
        "c": None if dc is None else dc.desc(),
        "d_scale": scalar_desc(d_scale),
        "d_amax": None if amax is None else amax.desc(),
        "bias": None if bias is None else device(bias).desc(),
        "pre_gelu_out": None if pre is None else pre.desc(),
        "bias_grad": None if grad is None else grad.desc(),
        "alpha": float(alpha),
        "beta": float(beta),
        "transa": bool(transa),
        "transb": bool(transb),
        "use_split_accumulator": bool(use_split_accumulator),
    }
    size = lib.gemm_workspace_size(da.desc(), db.desc(), d.desc(), **args)
    workspace = device(shape=(size,), dtype=np.uint8)
    if core_device.current() == "cpu":
        lib.gemm(da.desc(), db.desc(), d.desc(), workspace=workspace.desc(), **args)
    else:
        import torch

        stream = stream or torch.cuda.current_stream()
        torch.cuda.synchronize()  # buffers were filled on the current stream; `stream` may differ
        lib.gemm(da.desc(), db.desc(), d.desc(), workspace=workspace.desc(), stream=stream.cuda_stream, **args)
        stream.synchronize()
    return GemmOutput(
        d.numpy(),
        None if pre is None else pre.numpy(),
        None if grad is None else grad.numpy(),
        None if amax is None else amax.numpy()[()],
    )
