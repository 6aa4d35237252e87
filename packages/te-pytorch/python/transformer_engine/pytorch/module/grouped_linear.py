"""te.GroupedLinear: num_gemms independent linears applied to consecutive row
blocks of one input (the experts of a mixture-of-experts layer).

    y[rows of split i] = x[rows of split i] W_i^T + b_i,  split sizes m_splits

Each split is one te.Linear computation (LinearFunction: the same FP8
GEMM forms, recipes and weight/bias gradients), with the quantizers of GEMM i
(forward slots 3i, 3i + 1, backward slot 2i of the module's FP8 state, as the
reference lays them out). Splits of 0 rows give no GEMM and zero gradients.
The GEMMs run one after the other (no grouped-GEMM kernel yet).
"""

from __future__ import annotations

import torch

from ..quantization import FP8GlobalStateManager
from ._args import check_module_args
from ._linear_fn import LinearArgs, LinearFunction
from .base import DEFAULT_DEVICE, TransformerEngineBaseModule, not_yet_supported, reject_tp_group, resolve_device
from .linear import init_method_normal

_OWNER = "te.GroupedLinear"


class GroupedLinear(TransformerEngineBaseModule):
    """The reference's GroupedLinear (§2.2): parameters weight{i} [out, in] and
    bias{i} [out]; forward(inp, m_splits) with sum(m_splits) rows of inp.
    Tensor/sequence parallelism, communication overlap, delayed wgrad,
    single grouped parameters and grouped tensors are accepted at their
    defaults only (NotImplementedError otherwise)."""

    def __init__(
        self,
        num_gemms: int,
        in_features: int,
        out_features: int,
        sequence_parallel: bool = False,
        fuse_wgrad_accumulation: bool = False,
        tp_group=None,
        tp_size: int = 1,
        get_rng_state_tracker=None,
        rng_tracker_name=None,
        init_method=None,
        bias: bool = True,
        return_bias: bool = False,
        params_dtype=None,
        parallel_mode=None,
        device=DEFAULT_DEVICE,
        ub_overlap_rs: bool = False,
        ub_overlap_ag: bool = False,
        ub_name=None,
        delay_wgrad_compute: bool = False,
        save_original_input: bool = False,
        single_grouped_weight: bool = False,
        single_grouped_bias: bool = False,
        name=None,
        use_grouped_tensor=None,
    ) -> None:
        params_dtype = check_module_args(
            _OWNER,
            sizes={"num_gemms": num_gemms, "in_features": in_features, "out_features": out_features},
            flags={"bias": bias, "return_bias": return_bias, "fuse_wgrad_accumulation": fuse_wgrad_accumulation},
            params_dtype=params_dtype,
        )
        super().__init__(num_gemms=num_gemms)
        not_yet_supported(
            _OWNER,
            sequence_parallel=(sequence_parallel, False),
            tp_size=(tp_size, 1),
            parallel_mode=(parallel_mode, None),
            ub_overlap_rs=(ub_overlap_rs, False),
            ub_overlap_ag=(ub_overlap_ag, False),
            delay_wgrad_compute=(delay_wgrad_compute, False),
            save_original_input=(save_original_input, False),
            single_grouped_weight=(single_grouped_weight, False),
            single_grouped_bias=(single_grouped_bias, False),
            use_grouped_tensor=(bool(use_grouped_tensor), False),
        )
        reject_tp_group(_OWNER, tp_group)
        if self.primary_weights_in_fp8:
            raise NotImplementedError(
                f"{_OWNER}: quantized_model_init is not yet supported by transformer_engine.pytorch"
            )
        del get_rng_state_tracker, rng_tracker_name, ub_name  # (used by tensor parallelism only)
        self.num_gemms = num_gemms
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bias
        self.return_bias = return_bias
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.name = name
        self.init_method = init_method_normal() if init_method is None else init_method
        self.params_dtype = params_dtype
        self._allocate(resolve_device(device, _OWNER) if device != "meta" else torch.device("meta"))
        if device != "meta":
            self.reset_parameters()

    def _allocate(self, device: torch.device) -> None:
        for i in range(self.num_gemms):
            w = torch.empty(self.out_features, self.in_features, device=device, dtype=self.params_dtype)
            self.register_parameter(f"weight{i}", torch.nn.Parameter(w))
            b = torch.empty(self.out_features, device=device, dtype=self.params_dtype) if self.use_bias else None
            self.register_parameter(f"bias{i}", None if b is None else torch.nn.Parameter(b))

    def reset_parameters(self, defer_init: bool = False) -> None:
        """init_method on every weight, zero biases; meta parameters are first materialized."""
        if defer_init:
            return
        if self._parameter_device().type == "meta":
            self._allocate(resolve_device(DEFAULT_DEVICE, _OWNER))
        with torch.no_grad():
            for i in range(self.num_gemms):
                self.init_method(getattr(self, f"weight{i}"))
                if self.use_bias:
                    getattr(self, f"bias{i}").zero_()

    def forward(self, inp: torch.Tensor, m_splits, is_first_microbatch=None, out=None, dgrad_out=None):
        if out is not None or dgrad_out is not None:
            raise NotImplementedError(
                f"{_OWNER}: out= and dgrad_out= are not yet supported by transformer_engine.pytorch"
            )
        splits = _check_splits(inp, m_splits, self.num_gemms, self.in_features)
        device_type = inp.device.type
        act_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else inp.dtype
        state = self.fp8_state_for_forward(inp.device)
        fp8 = state is not None and FP8GlobalStateManager.fp8_enabled
        x = inp.reshape(-1, self.in_features)
        queue = None
        if state is not None and not fp8 and state.delayed:  # calibration: amaxes only
            self._calibrate(state, x, splits)
        if fp8:
            needs_grad = torch.is_grad_enabled() and (inp.requires_grad or self.weight0.requires_grad)
            queue = self.backward_update_queue(needs_grad)
            if queue is not None:
                # The backward update must follow every split's backward: a node
                # on the input, which all splits read, runs after all of them.
                x = _RunAfterBackward.apply(x, self._barrier(), queue)
        outs = []
        for i, (start, rows) in enumerate(splits):
            weight = getattr(self, f"weight{i}")
            bias = getattr(self, f"bias{i}") if self.use_bias else None
            if rows == 0:  # (no GEMM: an empty output whose gradients are zero)
                outs.append(x.new_zeros((0, self.out_features), dtype=act_dtype) + 0 * weight.sum().to(act_dtype))
                continue
            a = self._args(i, state if fp8 else None, rows, act_dtype, weight, is_first_microbatch)
            outs.append(LinearFunction.apply(x[start : start + rows], weight, None if self.return_bias else bias, a))
        y = torch.cat(outs).view(*inp.shape[:-1], self.out_features)
        if self.return_bias:
            biases = [getattr(self, f"bias{i}") if self.use_bias else None for i in range(self.num_gemms)]
            return y, biases
        return y

    def _args(self, i, state, rows, act_dtype, weight, is_first_microbatch) -> LinearArgs:
        a = LinearArgs()
        a.act_dtype = act_dtype
        a.fuse_wgrad = self.fuse_wgrad_accumulation
        a.weight_param = weight
        if state is None:
            return a
        state.check_dims(rows, self.in_features, self.out_features, _OWNER)
        fwd, bwd = self.quantizers["scaling_fwd"], self.quantizers["scaling_bwd"]
        a.fp8 = True
        a.input_q, a.weight_q, a.grad_q = fwd[3 * i], fwd[3 * i + 1], bwd[2 * i]
        a.split_acc = state.split_accumulator
        a.cache_weight = a.reuse_weight = False  # (no per-expert weight cache yet: quantized each forward)
        del is_first_microbatch
        return a

    def _calibrate(self, state, x, splits) -> None:
        fwd = self.quantizers["scaling_fwd"]
        for i, (start, rows) in enumerate(splits):
            if rows:
                fwd[3 * i].calibrate(x[start : start + rows])
                fwd[3 * i + 1].calibrate(getattr(self, f"weight{i}"))

    def _barrier(self) -> torch.Tensor:
        """A zero-element leaf that requires grad: it makes _RunAfterBackward's
        node run even when the input needs no gradient."""
        t = getattr(self, "_barrier_leaf", None)
        if t is None or t.device != self.weight0.device:
            t = torch.zeros(0, device=self.weight0.device, requires_grad=True)
            self.__dict__["_barrier_leaf"] = t
        return t


class _RunAfterBackward(torch.autograd.Function):
    """Identity on x whose backward runs the delayed-scaling backward queue."""

    @staticmethod
    def forward(ctx, x, barrier, queue):
        ctx.queue = queue
        ctx.x_grad = x.requires_grad
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.queue.run()
        return (grad if ctx.x_grad else None), None, None


def _check_splits(inp, m_splits, num_gemms, in_features):
    """[(start row, rows)] of each split, checked against inp."""
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"{_OWNER}: argument 'inp' must be a torch.Tensor, got {type(inp).__name__}")
    if inp.dim() < 1 or inp.shape[-1] != in_features:
        raise ValueError(f"{_OWNER}: inp must be [..., {in_features}], got shape {tuple(inp.shape)}")
    if isinstance(m_splits, torch.Tensor):
        m_splits = m_splits.tolist()
    if len(m_splits) != num_gemms or any(isinstance(m, bool) or int(m) != m or m < 0 for m in m_splits):
        raise ValueError(f"{_OWNER}: m_splits must be {num_gemms} non-negative ints, got {m_splits!r}")
    rows = inp.numel() // in_features
    if sum(int(m) for m in m_splits) != rows:
        raise ValueError(f"{_OWNER}: m_splits must sum to the {rows} rows of inp, got sum {sum(m_splits)}")
    out, start = [], 0
    for m in m_splits:
        out.append((start, int(m)))
        start += int(m)
    return out
