"""OperationFuser: runs a pipeline of fusible operations in one autograd function.

Autograd works at the pipeline level, so that the forward and the backward
pass can each be fused on their own: the registered fusion functions (see
register_forward_fusion and friends) rewrite the list of basic ops into
fused ops, once per change of the recipe type or of which ops need a
backward pass. Joint forward-backward fusions run first; forward-only and
backward-only fusions then rewrite the result independently.

Extra tensors: a basic op with num_extra_inputs takes that many tensors from
the fuser's call (after the main input, in op order); its extra outputs are
returned after the main output, in op order. Their gradients flow back
through the same autograd function.

Delayed scaling: each forward registers the ops' forward states for the
update at the exit of the outermost te.autocast; the backward states are
registered too, and the fuser whose ops were the first FP8 ops of the region
(its backward runs last) runs the backward update at the end of its backward.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from ..quantization import FP8GlobalStateManager
from .op import BasicOperation, FusedOperation, FusibleOperation, OperationContext

# func(ops, *, recipe) -> ops, with runs of basic ops replaced by fused ops.
OperationFusionFunction = Callable[..., list]


def _register_tensors(ops: list[BasicOperation], requires_backward: list[bool]):
    """Per-forward delayed-scaling bookkeeping; returns the update queue this
    pipeline's backward must run (or None)."""
    manager = FP8GlobalStateManager
    queue = None
    for op, backward in zip(ops, requires_backward):
        if op.fp8_meta is None:
            continue
        if op.num_quantizers("forward"):
            op.fp8_meta["scaling_fwd"].on_forward(manager)
        if backward and op.num_quantizers("backward"):
            queue = op.fp8_meta["scaling_bwd"].backward_queue(manager) or queue
    return queue


class _OperationFuserAutogradFunction(torch.autograd.Function):
    """The autograd function of a pipeline: its ops' forward, then their backward in reverse."""

    @staticmethod
    def forward(func_ctx, input_, fuser: OperationFuser, basic_op_kwargs, *params_and_extra_inputs):
        ops = fuser._basic_ops
        ctxs = [OperationContext() for _ in ops]
        extra_inputs = params_and_extra_inputs[len(fuser._flat_params) :]
        per_op_extra = fuser._split_extra_inputs(extra_inputs)
        first = fuser.first_op_requiring_backward
        for i, ctx in enumerate(ctxs):
            ctx.requires_grad = i >= first
        x = input_
        extra_outputs = [() for _ in ops]
        for op, idxs in fuser._forward_ops:
            prev_q = ops[idxs[0] - 1].get_grad_output_quantizer() if idxs[0] > 0 else None
            next_q = ops[idxs[-1] + 1].get_input_quantizer() if idxs[-1] + 1 < len(ops) else None
            x, ys = op.fuser_forward(
                [ctxs[i] for i in idxs],
                x,
                basic_op_extra_inputs=[per_op_extra[i] for i in idxs],
                prev_op_grad_output_quantizer=prev_q,
                next_op_input_quantizer=next_q,
                basic_op_kwargs=[basic_op_kwargs[i] for i in idxs],
            )
            if len(ys) != len(idxs):
                raise RuntimeError(
                    f"Expected {type(op).__name__} to generate extra outputs for {len(idxs)} basic operations, "
                    f"but got {len(ys)}"
                )
            for i, y in zip(idxs, ys):
                if len(y) != ops[i].num_extra_outputs:
                    raise RuntimeError(
                        f"Expected op {i} to generate {ops[i].num_extra_outputs} extra outputs, but got {len(y)}"
                    )
                extra_outputs[i] = tuple(y)
        flat_extra = [y for ys in extra_outputs for y in ys]
        if func_ctx is not None:
            to_save = []
            for ctx in ctxs:
                start = len(to_save)
                to_save.extend(ctx.to_save or ())
                ctx.to_save = None
                ctx._saved_tensors_range = (start, len(to_save))
            func_ctx.save_for_backward(*to_save)
            func_ctx.backward_ops = fuser._backward_ops
            func_ctx.basic_ops = ops
            func_ctx.basic_op_ctxs = ctxs
            func_ctx.num_params = fuser._num_params
            func_ctx.bwd_queue = fuser._bwd_queue
        if flat_extra:
            return (x, *flat_extra)
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(func_ctx, grad_output, *grad_extra_outputs):
        ops, ctxs = func_ctx.basic_ops, func_ctx.basic_op_ctxs
        saved = func_ctx.saved_tensors
        for ctx in ctxs:
            ctx.saved_tensors = saved[slice(*ctx._saved_tensors_range)]
        it = iter(grad_extra_outputs)
        grad_extra = [[next(it) for _ in range(op.num_extra_outputs)] for op in ops]
        dx = grad_output
        grad_params = [None] * len(ops)
        grad_extra_inputs = [None] * len(ops)
        for op, idxs in reversed(func_ctx.backward_ops):
            if not any(ctxs[i].requires_grad for i in idxs):
                dx = None
                break
            dx, dparams, dextra = op.fuser_backward(
                [ctxs[i] for i in idxs], dx, basic_op_grad_extra_outputs=[grad_extra[i] for i in idxs]
            )
            for i, dp, de in zip(idxs, dparams, dextra):
                grad_params[i], grad_extra_inputs[i] = dp, de
                ctxs[i].saved_tensors = None
        flat_params = []
        for i, n in enumerate(func_ctx.num_params):
            dp = [None] * n if grad_params[i] is None else list(grad_params[i])
            if len(dp) != n:
                raise RuntimeError(f"Expected op {i} to generate {n} param grads, but got {len(dp)}")
            flat_params.extend(dp)
        flat_extra = []
        for i, op in enumerate(ops):
            de = (None,) * op.num_extra_inputs if grad_extra_inputs[i] is None else tuple(grad_extra_inputs[i])
            if len(de) != op.num_extra_inputs:
                raise RuntimeError(
                    f"Expected op {i} to generate grads for {op.num_extra_inputs} extra inputs, but got {len(de)}"
                )
            flat_extra.extend(de)
        if func_ctx.bwd_queue is not None:
            func_ctx.bwd_queue.run()  # (this pipeline held the region's first FP8 ops: its backward runs last)
        return (dx, None, None, *flat_params, *flat_extra)


class OperationFuser:
    """Manages the forward and backward passes of a pipeline of operations.

    Args:
        ops: List of FusibleOperation. Pipeline of operations
    """

    forward_backward_fusion_functions: list = []
    forward_fusion_functions: list = []
    backward_fusion_functions: list = []

    def __init__(self, ops: list[FusibleOperation]) -> None:
        self._ops = list(ops)  # (as given: a fused op's pre_first_fuser_forward reaches its basic ops)
        basic_ops = []
        for op in ops:
            basic_ops.extend(op.basic_ops if op.is_fused_op else [op])
        self._basic_ops: list[BasicOperation] = basic_ops
        self._num_basic_ops = len(basic_ops)
        self.num_extra_inputs = sum(op.num_extra_inputs for op in basic_ops)
        self._collect_params()
        self._forward_ops = self._backward_ops = None
        self._fusion_key = None
        self.first_op_requiring_backward = 0
        self._bwd_queue = None
        self._first_call = True

    def _collect_params(self) -> None:
        """The basic ops' parameters, as autograd inputs of the pipeline. Read
        again at each call: an op may get new parameter objects after the
        fuser was made (meta parameters materialized, a shared weight assigned)."""
        self._basic_op_params = [list(op.parameters()) for op in self._basic_ops]
        self._num_params = [len(p) for p in self._basic_op_params]
        self._flat_params = [p for params in self._basic_op_params for p in params]

    def _split_extra_inputs(self, extra_inputs) -> list[tuple]:
        it = iter(extra_inputs)
        return [tuple(next(it) for _ in range(op.num_extra_inputs)) for op in self._basic_ops]

    @staticmethod
    def _apply_fusions(ops, funcs, recipe) -> list:
        ops = list(ops)
        for func in funcs:
            ops = func(ops, recipe=recipe)
        return ops

    def _map_to_basic_ops(self, fused_ops) -> list[tuple[FusibleOperation, list[int]]]:
        """Each (possibly fused) op with the indices of the basic ops it covers;
        a fusion that does not cover the basic ops exactly, in order, is an error."""
        out, idx, basic = [], 0, self._basic_ops
        for op in fused_ops:
            covered = list(op.basic_ops) if isinstance(op, FusedOperation) else [op]
            idxs = []
            for b in covered:
                if idx >= len(basic) or b is not basic[idx]:
                    raise RuntimeError(
                        "Found mismatch after fusing operations "
                        f"(basic_ops={[type(o).__name__ for o in basic]}, "
                        f"fused_ops={[type(o).__name__ for o in fused_ops]})"
                    )
                idxs.append(idx)
                idx += 1
            out.append((op, idxs))
        if idx != len(basic):
            raise RuntimeError(f"Fused operations cover {idx} of {len(basic)} basic operations")
        return out

    def _first_requiring_backward(self, is_grad_enabled, input_, per_op_extra) -> int:
        if not is_grad_enabled:
            return self._num_basic_ops
        if input_.requires_grad:
            return 0
        for i in range(self._num_basic_ops):
            tensors = itertools.chain(self._basic_op_params[i], per_op_extra[i])
            if any(t is not None and t.requires_grad for t in tensors):
                return i
        return self._num_basic_ops

    def maybe_fuse_ops(self, is_grad_enabled: bool, recipe, input_: torch.Tensor, extra_inputs) -> None:
        """Syncs every op's quantization state to `recipe` and refuses again if
        the recipe type or the ops needing a backward changed."""
        first = self._first_requiring_backward(is_grad_enabled, input_, extra_inputs)
        for op in self._basic_ops:
            op.reset_recipe_state(recipe=recipe, device=input_.device)
        key = (type(recipe), first)
        if key == self._fusion_key:
            return
        if self._first_call:
            for op in self._ops:
                op.pre_first_fuser_forward()
            self._first_call = False
        cls = OperationFuser
        joint = self._apply_fusions(self._basic_ops, cls.forward_backward_fusion_functions, recipe)
        self._forward_ops = self._map_to_basic_ops(self._apply_fusions(joint, cls.forward_fusion_functions, recipe))
        self._backward_ops = self._map_to_basic_ops(self._apply_fusions(joint, cls.backward_fusion_functions, recipe))
        self._fusion_key = key
        self.first_op_requiring_backward = first

    def __call__(self, input: torch.Tensor, *extra_inputs: torch.Tensor, basic_op_kwargs=None):  # noqa: A002
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"te.ops: the input must be a torch.Tensor, got {type(input).__name__}")
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(f"Expected {self.num_extra_inputs} extra inputs but got {len(extra_inputs)}")
        if basic_op_kwargs is None:
            basic_op_kwargs = [{}] * self._num_basic_ops
        manager = FP8GlobalStateManager
        recipe = manager.get_fp8_recipe() if manager.is_fp8_enabled() else None
        is_grad_enabled = torch.is_grad_enabled()
        self._collect_params()
        self.maybe_fuse_ops(is_grad_enabled, recipe, input, self._split_extra_inputs(extra_inputs))
        self._collect_params()
        first = self.first_op_requiring_backward
        for i, op in enumerate(self._basic_ops):
            op.pre_fuser_forward(requires_grad=i >= first)
        self._bwd_queue = None
        if recipe is not None:
            needs = [is_grad_enabled and i >= first for i in range(self._num_basic_ops)]
            self._bwd_queue = _register_tensors(self._basic_ops, needs)
        args = (input, self, basic_op_kwargs, *self._flat_params, *extra_inputs)
        if not is_grad_enabled:
            return _OperationFuserAutogradFunction.forward(None, *args)
        return _OperationFuserAutogradFunction.apply(*args)


def _register(functions: list, op_fusion_func, prepend: bool) -> None:
    if not callable(op_fusion_func):
        raise TypeError(f"op_fusion_func must be callable, got {type(op_fusion_func).__name__}")
    if prepend:
        functions.insert(0, op_fusion_func)
    else:
        functions.append(op_fusion_func)


def register_forward_backward_fusion(op_fusion_func: OperationFusionFunction, prepend: bool = False) -> None:
    """Registers a joint forward-backward fusion: ``func(ops, *, recipe) -> ops``.

    Its fused ops implement both fuser_forward and fuser_backward, and only
    the pair must match the basic ops (the forward may save state that only
    its own backward reads). Joint fusions run before the forward-only and
    backward-only passes. prepend: run it first in its pass (default: last).
    """
    _register(OperationFuser.forward_backward_fusion_functions, op_fusion_func, prepend)


def register_forward_fusion(op_fusion_func: OperationFusionFunction, prepend: bool = False) -> None:
    """Registers a forward-only fusion: ``func(ops, *, recipe) -> ops``.

    Its fused ops implement fuser_forward, equivalent to the basic ops'
    forward: each basic op's context gets what its unfused backward reads.
    prepend: run it first in the forward pass (default: last).
    """
    _register(OperationFuser.forward_fusion_functions, op_fusion_func, prepend)


def register_backward_fusion(op_fusion_func: OperationFusionFunction, prepend: bool = False) -> None:
    """Registers a backward-only fusion: ``func(ops, *, recipe) -> ops``.

    Its fused ops implement fuser_backward from the contexts the unfused
    forward saved, giving the basic ops' gradients.
    prepend: run it first in the backward pass (default: last).
    """
    _register(OperationFuser.backward_fusion_functions, op_fusion_func, prepend)


__all__ = [
    "OperationFuser",
    "register_backward_fusion",
    "register_forward_backward_fusion",
    "register_forward_fusion",
]
