"""Activation recomputation that keeps the FP8 state right, and RNG trackers.

    out = te.checkpoint(block, x)           # block's activations are recomputed in backward

te.checkpoint wraps torch.utils.checkpoint (reentrant by default, as the
reference). What it adds is the quantization context:
- The recompute runs in backward, outside the te.autocast region of the
  forward. It runs under the same recipe as the original forward (the autocast
  settings are saved when the forward runs).
- Delayed scaling: by the time the recompute runs, the exit of that autocast
  has updated every forward scale and rolled the amax histories. The recompute
  quantizes with the scales the original forward used (saved when each
  module registered its forward state) and its amaxes do not reach the new
  history row; the scales and staging rows are put back afterwards. It
  queues no second forward update. So outputs and gradients are identical to
  the run without recomputation (tests/test_te_checkpoint.py).
- Backward states: reentrant checkpointing runs the original forward without
  grad, so the modules inside register their backward state only in the
  recompute, when the region's backward update may have run already. The
  recompute therefore gets a backward queue of its own: its first FP8 module
  runs the update of the segment's backward states at the end of the
  segment's backward, as the region's first module does for the rest (the
  states are per module, so this equals one update of all of them).
  Non-reentrant checkpointing keeps the autograd graph of the original
  forward, whose modules registered with the region's queue as usual.
- A te.autocast region inside the function runs its forward update in the
  original forward (reentrant checkpointing runs it without grad, where
  te.autocast would otherwise skip the update as for inference).
Current scaling and the block recipes keep no state: the recompute is the
same computation under the saved recipe.

The RNG of torch (CPU and CUDA) is restored for the recompute by
torch.utils.checkpoint; the states of a CudaRNGStatesTracker passed as
get_rng_state_tracker are saved and restored too, so dropout masks match.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import warnings

import torch
import torch.utils.checkpoint

from .quantization import FP8GlobalStateManager, _UpdateQueue


def is_fp8_activation_recompute_enabled() -> bool:
    """True while te.checkpoint runs a function's original forward."""
    return FP8GlobalStateManager.checkpoint_forward_depth > 0


def in_fp8_activation_recompute_phase() -> bool:
    """True while te.checkpoint recomputes a function's forward (in backward)."""
    return FP8GlobalStateManager.recompute_depth > 0


class _RecordingQueue:
    """Stands in for the forward update queue during a checkpointed forward:
    passes each state on to the real queue and keeps the scale it quantizes
    with (modules register their state before quantizing)."""

    def __init__(self, real: _UpdateQueue) -> None:
        self.real = real
        self.scales: dict[int, tuple] = {}

    def add(self, state, group) -> None:
        self.real.add(state, group)
        if id(state) not in self.scales:
            self.scales[id(state)] = (state, state.scale.clone())

    def __getattr__(self, name):  # groups, owner_taken, run: the real queue's
        return getattr(self.real, name)


class _RecomputeQueue(_UpdateQueue):
    """The forward update queue during a recompute: queues nothing for an
    update; a state the original forward used gets that forward's scale back
    until the recompute ends, and its staging amax row is kept as it was."""

    def __init__(self, saved) -> None:
        super().__init__()
        self.saved = saved  # id(state) -> (state, scale): a dict, or _AwaitingScales
        self.swapped: dict[int, tuple] = {}

    def add(self, state, group) -> None:
        entry = self.saved.get(id(state))
        if entry is None or id(state) in self.swapped:
            return
        self.swapped[id(state)] = (state, state.scale.clone(), state.amax_history[0].clone())
        state.scale.copy_(entry[1])

    def restore(self) -> None:
        # Stream-ordered after the recompute's kernels, which read the old scale.
        for state, scale, staging in self.swapped.values():
            state.scale.copy_(scale)
            state.amax_history[0].copy_(staging)
        self.swapped = {}


@contextlib.contextmanager
def _recording_forward():
    """The original forward of a checkpointed function: yields a dict that holds,
    after the block, the scale each delayed-scaling state quantized with."""
    s = FP8GlobalStateManager
    real = s.forward_queue
    recording = _RecordingQueue(real)
    s.forward_queue = recording
    s.checkpoint_forward_depth += 1
    scales: dict[int, tuple] = {}
    try:
        yield scales
    finally:
        s.checkpoint_forward_depth -= 1
        s.forward_queue = real
        scales.update(recording.scales)


@contextlib.contextmanager
def _recomputing(scales):
    """The recompute of a forward that _recording_forward recorded (see the module
    docstring): its scales back for the block, no second forward update, and a
    backward queue of its own."""
    s = FP8GlobalStateManager
    outer = (s.forward_queue, s.backward_queue)
    queue = _RecomputeQueue(scales)
    s.forward_queue, s.backward_queue = queue, _UpdateQueue()
    s.recompute_depth += 1
    try:
        yield
    finally:
        s.recompute_depth -= 1
        queue.restore()
        s.forward_queue, s.backward_queue = outer


class _AwaitingScales:
    """The scales activation_recompute_forward recorded, per delayed-scaling state,
    oldest first: a module's recomputes run in the order of its forwards (one step's
    layers recompute in reverse, the microbatches of a pipeline schedule in order),
    the pairing the reference keeps per module. Read like _RecomputeQueue's dict:
    get() hands out (and forgets) a state's oldest recorded scale."""

    def __init__(self) -> None:
        self.by_state: dict[int, collections.deque] = {}
        # Shared by every thread: backward (and so the recompute) may run on another
        # thread than the forward (autograd's device threads).
        self.lock = threading.Lock()

    def push(self, scales: dict[int, tuple]) -> None:
        with self.lock:
            for key, entry in scales.items():
                self.by_state.setdefault(key, collections.deque()).append(entry)

    def get(self, key: int):
        with self.lock:
            waiting = self.by_state.get(key)
            if not waiting:
                return None
            entry = waiting.popleft()
            if not waiting:
                del self.by_state[key]
            return entry

    def __len__(self) -> int:
        with self.lock:
            return sum(len(d) for d in self.by_state.values())


_AWAITING_RECOMPUTE = _AwaitingScales()


@contextlib.contextmanager
def activation_recompute_forward(activation_recompute: bool = False, recompute_phase: bool = False):
    """The reference's context for activation recomputation written outside
    te.checkpoint (Megatron-Core's CheckpointFunction and CheckpointWithoutOutput).

    With activation_recompute=True under FP8 (te.autocast enabled): with
    recompute_phase=False the block is a checkpointed function's original forward
    (is_fp8_activation_recompute_enabled() is True inside; the scales it quantizes
    with are recorded); with recompute_phase=True it is that forward's recompute
    in backward (in_fp8_activation_recompute_phase() is True inside), which
    quantizes with the scale each module's oldest unmatched recorded forward used,
    queues no second forward update and runs its modules' backward update itself,
    exactly as te.checkpoint does. Otherwise the block runs unchanged. The caller runs the
    recompute under the forward's te.autocast settings (Megatron-Core does)."""
    if not (activation_recompute and FP8GlobalStateManager.fp8_enabled):
        yield
        return
    if not recompute_phase:
        with _recording_forward() as scales:
            yield
        _AWAITING_RECOMPUTE.push(scales)
        return
    with _recomputing(_AWAITING_RECOMPUTE):
        yield


class _Checkpointed:
    """The function as torch.utils.checkpoint calls it: once for the forward,
    once more for the recompute in backward."""

    def __init__(self, function, rng_tracker) -> None:
        self.function = function
        self.rng_tracker = rng_tracker
        self.calls = 0
        s = FP8GlobalStateManager
        self.fp8 = (s.fp8_enabled, s.fp8_calibration, s.fp8_recipe, s.fp8_group)
        self.scales: dict[int, tuple] = {}
        self.rng_states = None

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            return self._forward(args, kwargs)
        return self._recompute(args, kwargs)

    def _forward(self, args, kwargs):
        if self.rng_tracker is not None:
            self.rng_states = self.rng_tracker.get_states()
        with _recording_forward() as self.scales:
            return self.function(*args, **kwargs)

    def _recompute(self, args, kwargs):
        s = FP8GlobalStateManager
        outer = (s.fp8_enabled, s.fp8_calibration, s.fp8_recipe, s.fp8_group)
        s.fp8_enabled, s.fp8_calibration, s.fp8_recipe, s.fp8_group = self.fp8
        try:
            with _recomputing(self.scales), self._rng():
                return self.function(*args, **kwargs)
        finally:
            s.fp8_enabled, s.fp8_calibration, s.fp8_recipe, s.fp8_group = outer

    @contextlib.contextmanager
    def _rng(self):
        if self.rng_tracker is None or self.rng_states is None:
            yield
            return
        current = self.rng_tracker.get_states()
        self.rng_tracker.set_states(self.rng_states)
        try:
            yield
        finally:
            self.rng_tracker.set_states(current)


def _legacy_positional(args: tuple) -> bool:
    """checkpoint(function, distribute_saved_activations, get_rng_state_tracker,
    tp_group, *args): the reference's old positional form."""
    return len(args) >= 3 and isinstance(args[0], bool) and (args[1] is None or callable(args[1]))


def checkpoint(function, *args, **kwargs):
    """Recomputes `function`'s activations in backward instead of saving them.

    The reference's signature: ``checkpoint(function, *args, **kwargs)``, with
    distribute_saved_activations (False), get_rng_state_tracker (None),
    tp_group (None) and use_reentrant (True) popped from kwargs; the other
    kwargs go to `function`. Works for plain callables, modules and
    autograd.Function.apply.
    """
    if _legacy_positional(args):
        warnings.warn(
            "Passing distribute_saved_activations, get_rng_state_tracker and tp_group "
            "positionally to te.checkpoint is deprecated; pass them as keyword arguments",
            DeprecationWarning,
            stacklevel=2,
        )
        kwargs.setdefault("distribute_saved_activations", args[0])
        kwargs.setdefault("get_rng_state_tracker", args[1])
        kwargs.setdefault("tp_group", args[2])
        args = args[3:]
    distribute = kwargs.pop("distribute_saved_activations", False)
    get_tracker = kwargs.pop("get_rng_state_tracker", None)
    tp_group = kwargs.pop("tp_group", None)
    use_reentrant = kwargs.pop("use_reentrant", True)
    if distribute and tp_group is not None and torch.distributed.get_world_size(tp_group) > 1:
        raise NotImplementedError(
            "te.checkpoint: distribute_saved_activations=True over a tp_group of more than one rank "
            "is not yet supported by transformer_engine.pytorch"
        )
    tracker = get_tracker() if get_tracker is not None else None
    wrapped = _Checkpointed(function, tracker)
    return torch.utils.checkpoint.checkpoint(wrapped, *args, use_reentrant=use_reentrant, **kwargs)


class CudaRNGStatesTracker:
    """Named RNG states (the reference's tensor-parallel dropout helper).

    add(name, seed) creates a state seeded with `seed`; fork(name) runs its
    block with that state and keeps what the block advanced. The states are
    those of the current CUDA device when CUDA is available, else of the CPU
    generator (te-pytorch runs on the CPU too).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"cuda rng state {name} already exists")
        self.seeds_.add(seed)
        saved = _get_rng_state()
        try:
            _manual_seed(seed)
            self.states_[name] = _get_rng_state()
        finally:
            _set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise KeyError(f"cuda rng state {name} is not added")
        saved = _get_rng_state()
        _set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _get_rng_state()
            _set_rng_state(saved)


def _get_rng_state() -> torch.Tensor:
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.get_rng_state()


def _set_rng_state(state: torch.Tensor) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


def _manual_seed(seed: int) -> None:
    if torch.cuda.is_available():
        torch.cuda.manual_seed(seed)
    else:
        torch.manual_seed(seed)
