"""Per-tensor FP8: Float8Tensor, Float8Quantizer (delayed scaling) and
Float8CurrentScalingQuantizer.

A Float8Tensor of nominal shape S holds
    _data       uint8 FP8 bytes of shape S (the rowwise copy), or None
    _transpose  uint8 [K, M]: the transpose of S viewed as a matrix [M, K]
                (the columnwise copy Hopper GEMMs need), or None
    _scale_inv  FP32 [1]: value = float32(q) * _scale_inv
    _fp8_dtype  DType.kFloat8E4M3 or DType.kFloat8E5M2
Exact ops (no rounding): detach, view/reshape (the transpose survives when the
last dim is unchanged), clone, neg, abs, split/chunk and slices along dim 0,
moves between devices. Everything else runs on the dequantized value.
torch.save / torch.load round-trip the bytes exactly, also with
torch.load(weights_only=True).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from transformer_engine.core import DType

from .. import kernels
from ..kernels._common import compiling
from ..kernels.cast import quantize_fp8_current_scaling_prepared, quantize_fp8_prepared
from .quantized_tensor import QuantizedTensor, Quantizer

_TORCH_FP8 = {torch.float8_e4m3fn: DType.kFloat8E4M3, torch.float8_e5m2: DType.kFloat8E5M2}
# Looked up by int code rather than calling DType(value): older dynamo versions
# (torch 2.11) cannot trace an Enum constructor inside torch.compile.
_FP8_BY_CODE = {int(DType.kFloat8E4M3): DType.kFloat8E4M3, int(DType.kFloat8E5M2): DType.kFloat8E5M2}
aten = torch.ops.aten


def fp8_dtype_of(value) -> DType:
    """A DType FP8 member from a DType, its int code or a torch float8 dtype."""
    if isinstance(value, torch.dtype) and value in _TORCH_FP8:
        return _TORCH_FP8[value]
    code = _FP8_BY_CODE.get(int(value)) if isinstance(value, int) else None
    if code is None:
        raise TypeError(f"fp8_dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2, got {value!r}")
    return code


class Float8Tensor(QuantizedTensor):
    """Per-tensor FP8 tensor (see the module docstring for its fields)."""

    HANDLERS: ClassVar[dict] = {}

    @staticmethod
    def __new__(
        cls, shape, dtype, data, fp8_scale_inv, fp8_dtype, requires_grad=False, data_transpose=None, quantizer=None
    ):
        source = data if data is not None else data_transpose
        if source is None:
            raise ValueError("Float8Tensor needs 'data' or 'data_transpose'")
        self = torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=dtype, device=source.device, requires_grad=requires_grad
        )
        self._data = data
        self._transpose = data_transpose
        self._transpose_invalid = data_transpose is None
        self._scale_inv = fp8_scale_inv
        self._fp8_dtype = fp8_dtype_of(fp8_dtype)
        self._quantizer = quantizer
        return self

    def _like(self, data, transpose, scale_inv=None, shape=None, device_move=False):
        return Float8Tensor(
            self.shape if shape is None else shape,
            self.dtype,
            data,
            self._scale_inv if scale_inv is None else scale_inv,
            self._fp8_dtype,
            data_transpose=transpose,
            quantizer=None if device_move else self._quantizer,
        )

    def _dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        code = int(self._fp8_dtype)
        if self._data is not None:
            return kernels.dequantize_fp8(self._data, self._scale_inv, code, dtype)
        cols = kernels.dequantize_fp8(self._transpose, self._scale_inv, code, dtype)
        return cols.t().reshape(self.shape)

    def update_usage(self, *, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drop a copy that is not needed, or build the transpose from the data."""
        if columnwise_usage and self._transpose is None:
            self._transpose = _transpose_bytes(self._data)
            self._transpose_invalid = False
        if rowwise_usage is False and self._transpose is not None:
            self._data = None
        if columnwise_usage is False and self._data is not None:
            self._transpose = None
            self._transpose_invalid = True

    def clear(self) -> None:
        """Release the FP8 buffers (the tensor keeps its shape, not its values)."""
        self._data = None
        self._transpose = None
        self._transpose_invalid = True

    def get_metadata(self) -> dict:
        return {"fp8_scale_inv": self._scale_inv, "fp8_dtype": self._fp8_dtype, "quantizer": self._quantizer}

    def __reduce_ex__(self, protocol):
        return (
            _make_float8_tensor,
            (
                tuple(self.shape),
                self.dtype,
                self._data,
                self._scale_inv,
                int(self._fp8_dtype),
                self._transpose,
                self.requires_grad,
                self._quantizer,
            ),
        )


def _make_float8_tensor(shape, dtype, data, scale_inv, fp8_dtype, transpose, requires_grad, quantizer):
    """Rebuilds a pickled Float8Tensor (registered as a safe global for weights_only loads)."""
    return Float8Tensor(
        shape,
        dtype,
        data,
        scale_inv,
        fp8_dtype,
        requires_grad=requires_grad,
        data_transpose=transpose,
        quantizer=quantizer,
    )


def _transpose_bytes(data: torch.Tensor) -> torch.Tensor:
    cols = data.shape[-1] if data.dim() else 1
    return data.reshape(-1, cols).t().contiguous()


# --------------------------------------------------------------------------- exact ops


def _handles(*funcs):
    def register(fn):
        for func in funcs:
            Float8Tensor.HANDLERS[func] = fn
        return fn

    return register


@_handles(aten.detach.default, aten.alias.default)
def _detach(func, args, kwargs):
    t = args[0]
    return t._like(t._data, t._transpose)


@_handles(aten.clone.default)
def _clone(func, args, kwargs):
    t = args[0]
    clone = lambda x: None if x is None else x.clone()
    return t._like(clone(t._data), clone(t._transpose), t._scale_inv.clone())


@_handles(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(func, args, kwargs):
    t, shape = args[0], args[1]
    if t._data is None:
        return NotImplemented
    data = t._data.view(shape)
    same_rows = data.dim() > 0 and t._data.dim() > 0 and data.shape[-1] == t._data.shape[-1]
    return t._like(data, t._transpose if same_rows else None, shape=data.shape)


@_handles(aten.neg.default, aten.abs.default)
def _sign(func, args, kwargs):
    # FP8 is sign-magnitude and scale_inv > 0: flipping or clearing the sign bit is exact.
    t = args[0]
    if func is aten.neg.default:
        op = lambda x: None if x is None else torch.bitwise_xor(x, 0x80)
    else:
        op = lambda x: None if x is None else torch.bitwise_and(x, 0x7F)
    return t._like(op(t._data), op(t._transpose))


@_handles(aten.split.Tensor, aten.split_with_sizes.default, aten.slice.Tensor)
def _split_rows(func, args, kwargs):
    t = args[0]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    if t._data is None or t.dim() == 0 or dim not in (0, -t.dim()):
        return NotImplemented
    pieces = func(t._data, *args[1:], **kwargs)
    if isinstance(pieces, torch.Tensor):
        return t._like(pieces, None, shape=pieces.shape)
    return [t._like(p, None, shape=p.shape) for p in pieces]


@_handles(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    t = args[0]
    dtype = kwargs.get("dtype", t.dtype)
    device = kwargs.get("device", t.device)
    if dtype != t.dtype:
        return t._dequantize(dtype).to(device)
    move = lambda x: None if x is None else x.to(device)
    return t._like(move(t._data), move(t._transpose), t._scale_inv.to(device), device_move=True)


@_handles(aten.copy_.default)
def _copy(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, Float8Tensor):
        if isinstance(src, Float8Tensor) and src.shape == dst.shape and src._data is not None:
            # FP8 into FP8: the bytes and scale are the value; copy them (load_state_dict round-trips exactly).
            col = None if dst._transpose is None else src._transpose
            if dst._transpose is not None and col is None:
                col = _transpose_bytes(src._data)
            dst._fp8_dtype = src._fp8_dtype
            _store(dst, src._data.to(dst.device, copy=True), col, src._scale_inv.to(dst.device, copy=True))
            return dst
        dst.quantize_(src)
        return dst
    dst.copy_(src.dequantize())
    return dst


# --------------------------------------------------------------------------- quantizers


class Float8Quantizer(Quantizer):
    """Delayed-scaling FP8 quantizer.

    scale: FP32 one-element tensor applied before the cast (in a module, a
    view of fp8_meta["scaling_fwd"].scale). amax: FP32 one-element tensor
    max-accumulated with max|x| at each quantization (a view of the amax
    history's row 0), read by the recipe update after the step.
    """

    def __init__(
        self, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype, *, rowwise: bool = True, columnwise: bool = True
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.scale = scale
        self.amax = amax
        self.dtype = fp8_dtype_of(fp8_dtype)

    def quantize_parts(self, x: torch.Tensor, rowwise: bool, columnwise: bool):
        """(rowwise bytes | None, columnwise bytes | None, scale_inv)."""
        if compiling() or not (rowwise or columnwise):  # (the public op names the error)
            return kernels.quantize_fp8(x, self.scale, self.amax, int(self.dtype), rowwise, columnwise)
        scale_desc, amax_desc = _state_descs(self)
        return quantize_fp8_prepared(x, scale_desc, amax_desc, int(self.dtype), rowwise, columnwise)

    def _quantize(self, tensor):
        row, col, scale_inv = self.quantize_parts(tensor, self.rowwise_usage, self.columnwise_usage)
        return Float8Tensor(tensor.shape, tensor.dtype, row, scale_inv, self.dtype, data_transpose=col, quantizer=self)

    def update_quantized(self, src, dst, *, noop_flag=None):
        if noop_flag is not None and bool(noop_flag.reshape(-1)[0] == 1):
            return dst
        row, col, scale_inv = self.quantize_parts(
            src.to(dst.dtype), dst._data is not None or dst._transpose is None, dst._transpose is not None
        )
        _store(dst, row, col, scale_inv)
        return dst

    def make_empty(self, shape, *, dtype=torch.float32, device=None, requires_grad=False):
        device = self.scale.device if device is None else device
        shape = tuple(shape)
        data = torch.empty(shape, dtype=torch.uint8, device=device) if self.rowwise_usage else None
        transpose = None
        if self.columnwise_usage:
            transpose = torch.empty(kernels._common.matrix_t_shape(shape), dtype=torch.uint8, device=device)
        scale_inv = torch.ones((1,), dtype=torch.float32, device=device)
        return Float8Tensor(
            shape,
            dtype,
            data,
            scale_inv,
            self.dtype,
            requires_grad=requires_grad,
            data_transpose=transpose,
            quantizer=self,
        )

    def calibrate(self, tensor):
        torch.maximum(self.amax, kernels.compute_amax(tensor).view_as(self.amax), out=self.amax)

    def __reduce__(self):
        return (
            _make_float8_quantizer,
            (self.scale, self.amax, int(self.dtype), self.rowwise_usage, self.columnwise_usage),
        )


def _state_descs(q) -> tuple:
    """(scale, amax) descriptors of a quantizer's persistent one-element tensors,
    cached on it while it holds the same tensors; also records their device as
    x.get_device() would report it (-1 for the CPU)."""
    cached = q.__dict__.get("_descs")
    if cached is None or cached[2] is not q.scale or cached[3] is not q.amax:
        amax_desc = None if q.amax is None else kernels._common.desc(q.amax, kernels._common.FLOAT32)
        cached = (kernels._common.desc(q.scale, kernels._common.FLOAT32), amax_desc, q.scale, q.amax)
        q._descs = cached
        q._state_device = q.scale.get_device()
    return cached[0], cached[1]


def _make_float8_quantizer(scale, amax, fp8_dtype, rowwise, columnwise):
    return Float8Quantizer(scale, amax, fp8_dtype, rowwise=rowwise, columnwise=columnwise)


class Float8CurrentScalingQuantizer(Quantizer):
    """Current-scaling FP8 quantizer: each tensor is scaled by its own amax,
    scale = fp8_max / max(amax, amax_epsilon) (1 for an amax of 0, inf or
    NaN), rounded down to a power of 2 with force_pow_2_scales.

    with_amax_reduction: all-reduce (MAX) the amax over amax_reduction_group
    before the scale is computed (three core calls instead of one).
    use_existing_amax: take the amax from self.amax instead of the tensor.
    Otherwise each quantization (in eager mode, on the device of self.scale)
    writes its amax and scale into self.amax and self.scale: persistent
    buffers, so no per-call allocation for them and stable addresses for
    CUDA graphs.
    """

    def __init__(
        self,
        fp8_dtype,
        device=None,
        *,
        rowwise: bool = True,
        columnwise: bool = True,
        use_existing_amax: bool = False,
        with_amax_reduction: bool = False,
        amax_reduction_group=None,
        force_pow_2_scales: bool = False,
        amax_epsilon: float = 0.0,
        scale: torch.Tensor | None = None,
        amax: torch.Tensor | None = None,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = fp8_dtype_of(fp8_dtype)
        device = torch.device("cpu") if device is None else torch.device(device)
        self.scale = torch.ones((1,), dtype=torch.float32, device=device) if scale is None else scale
        self.amax = torch.zeros((1,), dtype=torch.float32, device=device) if amax is None else amax
        self.use_existing_amax = use_existing_amax
        self.with_amax_reduction = with_amax_reduction
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = force_pow_2_scales
        self.amax_epsilon = float(amax_epsilon)

    def quantize_parts(self, x: torch.Tensor, rowwise: bool, columnwise: bool):
        """(rowwise bytes | None, columnwise bytes | None, scale_inv)."""
        code = int(self.dtype)
        if not (self.use_existing_amax or self.with_amax_reduction or compiling()) and (rowwise or columnwise):
            scale_desc, amax_desc = _state_descs(self)
            if x.get_device() == self._state_device:
                # Eager fast path: scale and amax land in self.scale / self.amax.
                return quantize_fp8_current_scaling_prepared(
                    x, scale_desc, amax_desc, code, rowwise, columnwise, self.force_pow_2_scales, self.amax_epsilon
                )
        if not (self.use_existing_amax or self.with_amax_reduction):
            row, col, stats = kernels.quantize_fp8_current_scaling(
                x, code, rowwise, columnwise, self.force_pow_2_scales, self.amax_epsilon
            )
            return row, col, stats[1:2]
        amax = self.amax if self.use_existing_amax else kernels.compute_amax(x)
        if self.with_amax_reduction:
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=self.amax_reduction_group)
        scales = kernels.compute_scale_from_amax(amax, code, self.force_pow_2_scales, self.amax_epsilon)
        row, col, _ = kernels.quantize_fp8(x, scales[0:1], None, code, rowwise, columnwise)
        return row, col, scales[1:2]

    # ---- the amax fused into the kernel that produces x (norm / activation)

    def _updates_state(self, like: torch.Tensor) -> bool:
        """Whether quantize_parts of a tensor like `like` writes self.amax / self.scale
        (its eager fast path)."""
        plain = not (self.use_existing_amax or self.with_amax_reduction or compiling())
        return plain and like.get_device() == self.scale.get_device()

    def fused_amax_buffer(self, like: torch.Tensor) -> torch.Tensor | None:
        """A zeroed FP32 [1] tensor for the kernel that writes x (on like's device)
        to max-accumulate max|x| into, for quantize_parts_with_amax; None with
        use_existing_amax (the amax is not x's). Where quantize_parts would record
        the amax in self.amax, this is self.amax itself."""
        if self.use_existing_amax:
            return None
        if self._updates_state(like):
            return self.amax.zero_()
        return torch.zeros((1,), dtype=torch.float32, device=like.device)

    def quantize_parts_with_amax(self, x: torch.Tensor, amax: torch.Tensor, rowwise: bool, columnwise: bool):
        """quantize_parts(x, rowwise, columnwise) given amax = max|x| from the
        kernel that wrote x (fused_amax_buffer): the same bytes, scale_inv and
        quantizer state, without another pass over x for its amax."""
        code = int(self.dtype)
        if self.with_amax_reduction:
            torch.distributed.all_reduce(amax, op=torch.distributed.ReduceOp.MAX, group=self.amax_reduction_group)
        scales = kernels.compute_scale_from_amax(amax, code, self.force_pow_2_scales, self.amax_epsilon)
        row, col, _ = kernels.quantize_fp8(x, scales[0:1], None, code, rowwise, columnwise)
        if amax is self.amax:  # the fast path's state: self.amax holds the amax already
            self.scale.copy_(scales[0:1])
        return row, col, scales[1:2]

    _quantize = Float8Quantizer._quantize
    update_quantized = Float8Quantizer.update_quantized

    def make_empty(self, shape, *, dtype=torch.float32, device=None, requires_grad=False):
        return Float8Quantizer.make_empty(self, shape, dtype=dtype, device=device, requires_grad=requires_grad)

    def calibrate(self, tensor):
        torch.maximum(self.amax, kernels.compute_amax(tensor).view_as(self.amax), out=self.amax)

    def __reduce__(self):
        # A process group cannot be pickled: a loaded quantizer reduces over nothing.
        return (
            _make_current_scaling_quantizer,
            (
                int(self.dtype),
                self.scale.device,
                self.rowwise_usage,
                self.columnwise_usage,
                self.use_existing_amax,
                self.force_pow_2_scales,
                self.amax_epsilon,
            ),
        )


def _make_current_scaling_quantizer(
    fp8_dtype, device, rowwise, columnwise, use_existing_amax, force_pow_2_scales, amax_epsilon
):
    return Float8CurrentScalingQuantizer(
        fp8_dtype,
        device,
        rowwise=rowwise,
        columnwise=columnwise,
        use_existing_amax=use_existing_amax,
        force_pow_2_scales=force_pow_2_scales,
        amax_epsilon=amax_epsilon,
    )


def _store(dst: Float8Tensor, row, col, scale_inv) -> None:
    """Writes new FP8 buffers into dst, in place where the old ones fit (so
    views and CUDA-graph pointers of dst stay valid)."""
    for name, new in (("_data", row), ("_transpose", col), ("_scale_inv", scale_inv)):
        old = getattr(dst, name)
        if new is None:
            continue
        if old is not None and old.shape == new.shape and old.device == new.device:
            old.copy_(new)
        else:
            setattr(dst, name, new)
    dst._transpose_invalid = dst._transpose is None


SAFE_GLOBALS = [
    Float8Tensor,
    _make_float8_tensor,
    Float8Quantizer,
    _make_float8_quantizer,
    Float8CurrentScalingQuantizer,
    _make_current_scaling_quantizer,
    DType,
]
