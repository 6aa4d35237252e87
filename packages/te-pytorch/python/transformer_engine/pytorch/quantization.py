"""autocast, the global FP8 state, and the delayed-scaling update (§2.5, §3.3).

    with te.autocast(recipe=recipe.DelayedScaling()):
        out = model(inp)
    out.sum().backward()

Delayed scaling keeps, per module, a scale and an amax history for each
forward and backward tensor (recipe_state.py). Quantizing max-accumulates
max|x| into the history's row 0; then
- at the exit of the outermost autocast (when grad is enabled), every forward
  state that ran inside it is updated: the row-0 amaxes are concatenated,
  all-reduced (MAX) over amax_reduction_group when recipe.reduce_amax and the
  group has more than one rank, and all histories and scales are updated in
  one te-core call (per recipe, group and device);
- the backward states are updated the same way at the end of backward, by the
  backward of the first FP8 module that ran in the autocast region (it runs
  last).
Callable amax_compute_algo / scaling_factor_compute_algo use the unfused
torch path below instead of te-core.

The update follows the reference's rule whatever the amax: an inf or NaN
amax keeps the old scale; a finite one sets scale = fp8_max * 2^-margin /
amax, and with amax_compute_algo "max" one bad step drives the scale for the
amax_history_len steps its amax stays in the window (values far below it
then flush to 0), after which the scale recovers. So that this is never
silent, an update driven by a non-finite amax or one >= ABSURD_AMAX warns
(RuntimeWarning, naming the tensor). On CUDA the check reads the amaxes
through an asynchronous copy, so its warning comes at the next update
rather than stalling the step; updates captured in a CUDA graph
(make_graphed_callables) are not checked.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import torch

from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling
from transformer_engine.core import DType, lib

from . import device, kernels
from .kernels._common import compiling, stream_of
from .recipe_state import check_recipe_support

FLT_MAX = torch.finfo(torch.float32).max
# No trained network's activation or gradient reaches 2^64 (and an E4M3 scale
# from it, 448 / 2^64, flushes every value below ~1e-14 to 0): an amax this
# large is overflow or corruption, not data.
ABSURD_AMAX = 2.0**64


class _UpdateQueue:
    """Delayed-scaling states waiting for their amax reduction and update.

    Keyed by (recipe, group, device): each key is one te-core call. The key
    holds the recipe's id (hashing a recipe dataclass on every forward costs
    host time); the entry keeps the recipe itself alive, so the id stays valid.
    """

    def __init__(self) -> None:
        self.groups: dict = {}
        self.owner_taken = False

    def add(self, state, group) -> None:
        key = (id(state.recipe), id(group), state.device)
        entry = self.groups.get(key)
        if entry is None:
            entry = self.groups[key] = (state.recipe, group, {})
        entry[2][id(state)] = state

    def run(self) -> None:
        groups, self.groups = self.groups, {}
        for recipe, group, states in groups.values():
            states = list(states.values())
            with _locked(states):
                _AMAX_WATCH.check(states)
                _reduce_and_update(recipe, group, states)


@contextlib.contextmanager
def _locked(states: list):
    """Holds the locks of the states' modules (in one order: no deadlock
    between two threads updating overlapping sets)."""
    locks = {id(s.lock): s.lock for s in states if s.lock is not None}
    with contextlib.ExitStack() as stack:
        for key in sorted(locks):
            stack.enter_context(locks[key])
        yield


_ROLES = {"forward": ("input", "weight", "output"), "backward": ("grad_output", "grad_input")}


class _AmaxWatch:
    """Warns when a delayed-scaling update is about to use a non-finite or
    absurd staged amax (row 0 of a history, read before the update)."""

    def __init__(self) -> None:
        self.pending: list = []  # CUDA: (event, host copy of the amaxes, states)
        self.lock = threading.Lock()

    def check(self, states: list) -> None:
        rows = [s.amax_history[0] for s in states]
        if rows[0].device.type == "cpu":
            self._report(rows[0] if len(rows) == 1 else torch.cat(rows), states)
            return
        if torch.cuda.is_current_stream_capturing():
            return  # (a captured update: no host copy or event query may enter the graph)
        self._drain()
        staged = rows[0] if len(rows) == 1 else torch.cat(rows)
        host = staged.to("cpu", non_blocking=True)  # (stream-ordered before the update)
        event = torch.cuda.Event()
        event.record()
        with self.lock:
            self.pending.append((event, host, states))

    def _drain(self) -> None:
        if not self.pending:
            return
        with self.lock:  # (updates of several threads share the list)
            done = [p[0].query() for p in self.pending]
            ready = [p for p, d in zip(self.pending, done) if d]
            self.pending = [p for p, d in zip(self.pending, done) if not d]
        for _, host, states in ready:
            self._report(host, states)

    @staticmethod
    def _report(staged: torch.Tensor, states: list) -> None:
        bad = ~torch.isfinite(staged) | (staged >= ABSURD_AMAX)
        if not bool(bad.any()):
            return
        offset, found = 0, []
        for state in states:
            n = state.amax_history.shape[1]
            roles = _ROLES[state.mode]
            for i in torch.nonzero(bad[offset : offset + n]).flatten().tolist():
                found.append(
                    f"{state.mode} {roles[i % len(roles)]} of GEMM {i // len(roles)}: {staged[offset + i].item():.6g}"
                )
            offset += n
        history = states[0].recipe.amax_history_len
        warnings.warn(
            f"DelayedScaling: a scale update is driven by a non-finite or absurd amax (>= {ABSURD_AMAX:.3g}): "
            f"{'; '.join(found)}. The reference's rule applies: an inf/NaN amax keeps the old scale, a finite "
            f"one sets scale = fp8_max * 2^-margin / amax for as long as it is in the amax window "
            f"({history} steps with amax_compute_algo='max'), during which smaller values flush to 0; "
            "the scale recovers when the window passes",
            RuntimeWarning,
            stacklevel=4,
        )


_AMAX_WATCH = _AmaxWatch()


class _FP8GlobalState(threading.local):
    """The state autocast sets and the modules read: FP8GlobalStateManager.

    Thread-local, as torch.autocast's state is: each thread sees its own
    autocast depth, recipe, group and update queues (threading.local runs
    __init__ once per thread, on its first access), so a module called
    outside autocast in one thread never runs under another thread's recipe.
    An autocast region belongs to the thread that entered it. (The reference
    makes it a class with class attributes; an instance keeps its call sites
    -- FP8GlobalStateManager.is_fp8_enabled() and friends -- and lets
    torch.compile trace autocast inside a compiled function: torch 2.11's
    dynamo cannot set attributes on a class, but traces a threading.local.)"""

    def __init__(self) -> None:
        self.reset()

    def is_fp8_enabled(self) -> bool:
        return self.fp8_enabled

    def is_fp8_calibration(self) -> bool:
        return self.fp8_calibration

    def get_fp8_recipe(self):
        return self.fp8_recipe if self.fp8_recipe is not None else get_default_recipe()

    def get_fp8_group(self):
        return self.fp8_group

    def get_meta_tensor_key(self, forward: bool = True) -> str:
        return "scaling_fwd" if forward else "scaling_bwd"

    # The reference's availability queries, (available, reason) each (device.py).
    @staticmethod
    def is_fp8_available() -> tuple[bool, str]:
        return device.is_fp8_available(return_reason=True)

    @staticmethod
    def is_mxfp8_available() -> tuple[bool, str]:
        return device.is_mxfp8_available(return_reason=True)

    @staticmethod
    def is_fp8_block_scaling_available() -> tuple[bool, str]:
        return device.is_fp8_block_scaling_available(return_reason=True)

    @staticmethod
    def is_nvfp4_available() -> tuple[bool, str]:
        return device.is_nvfp4_available(return_reason=True)

    def reset(self) -> None:
        """Back to the state at import, in the calling thread (tests call this between cases)."""
        self.fp8_enabled = self.fp8_calibration = False
        self.fp8_recipe = self.fp8_group = None
        self.autocast_depth = 0
        # > 0 while te.checkpoint runs a function's original forward: reentrant
        # checkpointing runs it without grad, but it is a training step.
        self.checkpoint_forward_depth = 0
        # > 0 while a checkpointed forward is recomputed in this thread (in backward).
        self.recompute_depth = 0
        self.forward_queue = _UpdateQueue()
        self.backward_queue = _UpdateQueue()

    def reduce_and_update_fp8_tensors(self, forward: bool = True) -> None:
        """Runs the pending forward (or backward) delayed-scaling update now."""
        (self.forward_queue if forward else self.backward_queue).run()


FP8GlobalStateManager = _FP8GlobalState()


def get_default_recipe():
    """DelayedScaling() (the reference's choice on Hopper and older), or
    Float8CurrentScaling() on compute capability 12.0 and newer. The
    reference picks MXFP8BlockScaling on 10.x; here 10.x still gets
    DelayedScaling: this package's MXFP8 recipe has run on Hopper (emulated
    block-scaled GEMMs) but never on a 10.x GPU."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (12, 0):
        return Float8CurrentScaling()
    return DelayedScaling()


class autocast:
    """Runs TE modules inside it with quantized GEMMs (or calibrates them).

    Args:
        enabled:     quantize with `recipe` (default get_default_recipe()).
        calibrating: run in high precision but record the amaxes of a
                     DelayedScaling state, so that FP8 inference starts from
                     calibrated scales.
        amax_reduction_group: torch.distributed group over which delayed-scaling
                     amaxes are all-reduced (None: the default group).

    Wrap the forward pass only; backward may run outside. Nestable; one
    instance cannot be entered twice at the same time.
    Thread-local, as torch.autocast: the region applies to the thread that
    entered it (and is exited there); other threads keep their own state.
    """

    def __init__(
        self,
        enabled: bool = True,
        calibrating: bool = False,
        recipe=None,
        amax_reduction_group=None,
        _graph: bool = False,
    ) -> None:
        self.enabled = enabled
        self.calibrating = calibrating
        self.recipe = recipe
        self.amax_reduction_group = amax_reduction_group
        self._graph = _graph
        self._saved = None

    def __enter__(self):
        if self._saved is not None:
            raise RuntimeError("this te.autocast instance is already active; create a new one for a nested region")
        recipe = self.recipe
        if self.enabled or self.calibrating:
            # (A disabled region needs no recipe: building the default one
            # each time would only cost host time.)
            recipe = get_default_recipe() if recipe is None else recipe
            check_recipe_support(recipe)
        s = FP8GlobalStateManager
        self._saved = (s.fp8_enabled, s.fp8_calibration, s.fp8_recipe, s.fp8_group)
        # (dynamo cannot trace get_ident; a compiled region is one thread anyway)
        self._thread = None if compiling() else threading.get_ident()
        if s.autocast_depth == 0:
            if compiling():
                # Only current scaling compiles (no queued states), so clearing in
                # place is equivalent here and keeps the traced graph free of new
                # Python objects.
                s.backward_queue.groups = {}
                s.backward_queue.owner_taken = False
            else:
                s.backward_queue = _UpdateQueue()
        s.fp8_enabled = self.enabled
        s.fp8_calibration = self.calibrating
        s.fp8_recipe = recipe
        s.fp8_group = self.amax_reduction_group
        s.autocast_depth += 1
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._thread is not None and self._thread != threading.get_ident():
            raise RuntimeError(
                "te.autocast: a region must be exited in the thread that entered it (its state is thread-local)"
            )
        s = FP8GlobalStateManager
        s.fp8_enabled, s.fp8_calibration, s.fp8_recipe, s.fp8_group = self._saved
        self._saved = None
        s.autocast_depth -= 1
        training = torch.is_grad_enabled() or s.checkpoint_forward_depth > 0
        if s.autocast_depth == 0 and exc_type is None and not self._graph and training:
            s.forward_queue.run()


def fp8_autocast(
    enabled: bool = True, calibrating: bool = False, fp8_recipe=None, fp8_group=None, _graph: bool = False
) -> autocast:
    """Deprecated name of autocast (the reference renamed it in v2.9)."""
    warnings.warn(
        "fp8_autocast is deprecated; use te.autocast(enabled, calibrating, recipe, amax_reduction_group)",
        DeprecationWarning,
        stacklevel=2,
    )
    return autocast(
        enabled=enabled, calibrating=calibrating, recipe=fp8_recipe, amax_reduction_group=fp8_group, _graph=_graph
    )


# --------------------------------------------------------------------------- the update


def _world_size(group) -> int:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _reduce_and_update(recipe, group, states: list) -> None:
    """§3.3: reduce the row-0 amaxes over the group, then update every state."""
    algo = recipe.amax_compute_algo
    fused = not (callable(algo) or recipe.scaling_factor_compute_algo is not None)
    reduce = recipe.reduce_amax and _world_size(group) > 1
    if fused and not reduce and not compiling():
        # Eager fast path (every step of a single-process run): the states'
        # tensors were made float32 and contiguous by recipe_state, and their
        # descriptors are cached there.
        history_descs, scale_descs = [], []
        for state in states:
            descs = state.update_descs()
            history_descs.append(descs[0])
            scale_descs.append(descs[1])
        lib.delayed_scaling_update(
            None,
            history_descs,
            scale_descs,
            None,
            kernels.recipe.ALGOS[algo],
            int(states[0].dtype),
            float(recipe.margin),
            stream_of(states[0].amax_history),
        )
        return
    histories = [s.amax_history for s in states]
    buffer = None
    if reduce:
        buffer = torch.cat([h[0] for h in histories])
        torch.distributed.all_reduce(buffer, op=torch.distributed.ReduceOp.MAX, group=group)
    fp8_dtype = int(states[0].dtype)
    if not fused:
        _unfused_update(recipe, buffer, states)
        return
    kernels.delayed_scaling_update(
        buffer,
        histories,
        [s.scale for s in states],
        algo=recipe.amax_compute_algo,
        fp8_dtype=fp8_dtype,
        margin=float(recipe.margin),
    )


def _default_sf_compute(amax, scale, fp8_max: float, margin: float) -> torch.Tensor:
    """(fp8_max / amax) / 2^margin; the old scale where amax is 0, inf or NaN;
    FLT_MAX where the division overflows."""
    sf = (fp8_max / amax) / (2.0**margin)
    sf = torch.where(amax > 0.0, sf, scale)
    sf = torch.where(torch.isfinite(amax), sf, scale)
    return torch.where(torch.isinf(sf), torch.full_like(sf, FLT_MAX), sf)


def _unfused_update(recipe, buffer, states: list) -> None:
    """The reference's Python path, used when an algo is a callable."""
    offset = 0
    for state in states:
        history, n = state.amax_history, state.amax_history.shape[1]
        if buffer is not None:
            history[0].copy_(buffer[offset : offset + n])
        offset += n
        algo = recipe.amax_compute_algo
        if callable(algo):
            amax = algo(history)
        elif algo == "max":
            amax = history.max(dim=0).values
        else:
            amax = history[0].clone()
        history.copy_(torch.roll(history, -1, dims=0))
        history[0].zero_()
        fp8_max = 57344.0 if state.dtype == DType.kFloat8E5M2 else 448.0
        if recipe.scaling_factor_compute_algo is None:
            new = _default_sf_compute(amax, state.scale, fp8_max, float(recipe.margin))
        else:
            new = recipe.scaling_factor_compute_algo(amax, state.scale, fp8_max, recipe)
        state.scale.copy_(new)


# --------------------------------------------------------------------------- model init
# (in _model_init.py; re-exported here, where the reference defines them)
from ._model_init import fp8_model_init, quantized_model_init  # noqa: E402, F401
