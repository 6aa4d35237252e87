"""make_graphed_callables: CUDA graphs of TE modules, quantization included.

    model = te.make_graphed_callables(model, (x,), enabled=True, recipe=recipe.DelayedScaling())
    for x in batches:
        out = model(x)              # one graph replay for forward ...
        out.sum().backward()        # ... and one for backward

torch.cuda.make_graphed_callables does the capture (warm-up on a side stream,
forward graphs in order, backward graphs in reverse, one memory pool). What
this adds is the quantization region: each callable's forward runs inside
te.autocast with the given recipe, entered and left inside the captured
region. So the captured forward graph holds the callable's quantization and,
under delayed scaling, the update of its forward scales and amax histories
at the end of the forward; the captured backward graph holds the backward
quantization and the backward update (run by the backward of the callable's
first FP8 module, as in eager). Every replay therefore advances the FP8
state exactly as one eager step of the callable inside te.autocast does
(tests/test_make_graphed_callables.py compares the states). The warm-up
iterations run eagerly; the delayed-scaling states of module callables are
put back afterwards, so the first replay starts from the state the modules
had before (the states used by plain functions are not visible here: their
warm-up steps stay in them).

Each callable is its own quantization region: the delayed-scaling state is
per module, so that equals one autocast around all of them.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import torch

from .quantization import autocast, get_default_recipe

_DEPRECATED = {
    "fp8_enabled": "enabled",
    "fp8_calibrating": "calibrating",
    "fp8_recipe": "recipe",
    "fp8_group": "amax_reduction_group",
    "fp8_weight_caching": "cache_quantized_params",
}


def _resolve_deprecated(new: dict, old: dict) -> dict:
    for old_name, value in old.items():
        if value is None:
            continue
        name = _DEPRECATED[old_name]
        warnings.warn(
            f"make_graphed_callables: '{old_name}' is deprecated, use '{name}'", DeprecationWarning, stacklevel=3
        )
        if new[name] is not None and new[name] != value:
            raise ValueError(f"make_graphed_callables: '{old_name}' and '{name}' are both given and differ")
        new[name] = value
    return new


def _reject(**settings) -> None:
    for name, (value, default) in settings.items():
        if value != default:
            raise NotImplementedError(
                f"make_graphed_callables: {name}={value!r} is not yet supported by transformer_engine.pytorch; "
                f"leave it at {default!r}"
            )


class _KwargBinding:
    """Tensor keyword arguments become trailing positional graph inputs (torch
    graphs positional tensors only); other keyword values are fixed at capture."""

    def __init__(self, sample_kwargs: dict) -> None:
        self.tensor_keys = [k for k, v in sample_kwargs.items() if isinstance(v, torch.Tensor)]
        self.static = {k: v for k, v in sample_kwargs.items() if not isinstance(v, torch.Tensor)}

    def flat(self, args: tuple, kwargs: dict) -> tuple:
        extra = set(kwargs) - set(self.tensor_keys) - set(self.static)
        missing = set(self.tensor_keys) - set(kwargs)
        if extra or missing:
            raise TypeError(
                f"a graphed callable takes the keyword arguments it was captured with "
                f"({sorted(self.tensor_keys + list(self.static))}); got {sorted(kwargs)}"
            )
        for key, value in self.static.items():
            if key in kwargs and kwargs[key] != value:
                raise ValueError(
                    f"keyword argument '{key}' was {value!r} at capture and is fixed in the graph; got {kwargs[key]!r}"
                )
        return tuple(args) + tuple(kwargs[k] for k in self.tensor_keys)

    def call(self, fn, n_args: int, *flat):
        kwargs = dict(zip(self.tensor_keys, flat[n_args:]))
        return fn(*flat[:n_args], **kwargs, **self.static)


def _in_region(fn, region: dict):
    """fn run inside a fresh te.autocast with the capture's settings."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with autocast(**region):
            return fn(*args, **kwargs)

    return run


def make_graphed_callables(
    modules,
    sample_args,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    sample_kwargs=None,
    fp8_enabled=None,
    fp8_calibrating=None,
    fp8_recipe=None,
    fp8_group=None,
    fp8_weight_caching=None,
    enabled=None,
    calibrating=None,
    recipe=None,
    amax_reduction_group=None,
    cache_quantized_params=None,
    _order=None,
    _num_layers_per_chunk=None,
    pool=None,
    retain_graph_in_backward: bool = False,
    _reuse_graph_input_output_buffers: bool = False,
    clone_param_grads_on_return: bool = True,
    pre_warmup_hook=None,
    post_warmup_hook=None,
    capture_time_hooks=None,
):
    """The reference's make_graphed_callables: graphs of modules or callables
    (one, or a tuple in the order they run) with their sample_args (a tuple of
    tensors, or one such tuple per callable) and optional sample_kwargs (a
    dict, or one per callable). Returns what it was given, graphed. Needs
    CUDA: capture is a CUDA feature (sample tensors on the CPU are refused).

    Two faults of its first H200 run (2026-12-02) are fixed: parameter
    gradients added twice from the second replay on (autograd took the graph's
    static gradient buffer as .grad: see clone_param_grads_on_return) and FP8
    states built lazily during warm-up, so the warm-up's amaxes stayed in the
    delayed-scaling histories (the states are now built before the snapshot)."""
    settings = _resolve_deprecated(
        {
            "enabled": enabled,
            "calibrating": calibrating,
            "recipe": recipe,
            "amax_reduction_group": amax_reduction_group,
            "cache_quantized_params": cache_quantized_params,
        },
        {
            "fp8_enabled": fp8_enabled,
            "fp8_calibrating": fp8_calibrating,
            "fp8_recipe": fp8_recipe,
            "fp8_group": fp8_group,
            "fp8_weight_caching": fp8_weight_caching,
        },
    )
    _reject(
        _order=(_order, None),
        _num_layers_per_chunk=(_num_layers_per_chunk, None),
        retain_graph_in_backward=(retain_graph_in_backward, False),
        _reuse_graph_input_output_buffers=(_reuse_graph_input_output_buffers, False),
        capture_time_hooks=(capture_time_hooks, None),
        cache_quantized_params=(bool(settings["cache_quantized_params"]), False),
    )
    single = not isinstance(modules, tuple)
    callables = (modules,) if single else modules
    args_list = (sample_args,) if single else tuple(sample_args)
    if sample_kwargs is None:
        kwargs_list = tuple({} for _ in callables)
    else:
        kwargs_list = (sample_kwargs,) if single else tuple(sample_kwargs)
    if not (len(args_list) == len(kwargs_list) == len(callables)):
        raise ValueError(
            f"make_graphed_callables: {len(callables)} callables need as many sample_args and sample_kwargs "
            f"entries, got {len(args_list)} and {len(kwargs_list)}"
        )
    _check_cuda(args_list, kwargs_list)
    region = {
        "enabled": bool(settings["enabled"]),
        "calibrating": bool(settings["calibrating"]),
        "recipe": settings["recipe"],
        "amax_reduction_group": settings["amax_reduction_group"],
    }

    bindings = [_KwargBinding(kw) for kw in kwargs_list]
    flat_args = tuple(b.flat(tuple(a), kw) for b, a, kw in zip(bindings, args_list, kwargs_list))
    originals = []
    to_graph = []
    for c, a, binding in zip(callables, args_list, bindings):
        original = c.forward if isinstance(c, torch.nn.Module) else c
        originals.append(original)
        flat_fn = _in_region(functools.partial(binding.call, original, len(a)), region)
        if isinstance(c, torch.nn.Module):
            c.forward = flat_fn  # torch calls module(*flat) for warm-up and capture
            to_graph.append(c)
        else:
            to_graph.append(flat_fn)

    _init_fp8_states(callables, region, args_list)
    snapshot = _snapshot_fp8_states(callables)
    try:
        if pre_warmup_hook is not None:
            pre_warmup_hook()
        _warmup(to_graph, flat_args, num_warmup_iters, allow_unused_input)
        if post_warmup_hook is not None:
            post_warmup_hook()
        graphed = torch.cuda.make_graphed_callables(
            tuple(to_graph), flat_args, num_warmup_iters=0, allow_unused_input=allow_unused_input, pool=pool
        )
    except BaseException:
        for c, original in zip(callables, originals):
            if isinstance(c, torch.nn.Module):
                c.forward = original
        raise
    finally:
        _restore_fp8_states(snapshot)

    if clone_param_grads_on_return:  # (after capture: the hooks stay out of the graphs)
        _clone_stolen_param_grads(callables)
    results = []
    for c, g, binding in zip(callables, graphed, bindings):
        replay = g.forward if isinstance(c, torch.nn.Module) else g

        def forward(*args, _replay=replay, _binding=binding, **kwargs):
            return _replay(*_binding.flat(args, kwargs))

        if isinstance(c, torch.nn.Module):
            c.forward = forward
            results.append(c)
        else:
            results.append(forward)
    return results[0] if single else tuple(results)


def _check_cuda(args_list, kwargs_list) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("make_graphed_callables needs CUDA: CUDA graphs cannot be captured on this machine")
    for args, kwargs in zip(args_list, kwargs_list):
        for t in list(args) + list(kwargs.values()):
            if isinstance(t, torch.Tensor) and not t.is_cuda:
                raise ValueError(
                    "make_graphed_callables: every sample tensor must be on a CUDA device, got one on "
                    f"{t.device} (CUDA graphs capture CUDA work only)"
                )


def _warmup(callables, flat_args, iters: int, allow_unused: bool) -> None:
    """Eager steps on a side stream before capture, so that lazy initialization
    (handles, workspaces) stays out of the graphs. Unlike torch's warm-up, the
    output gradients are zeros, not uninitialized memory: delayed scaling
    records their amaxes (the states are restored after capture anyway)."""
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        for fn, args in zip(callables, flat_args):
            params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
            inputs = tuple(t for t in args + params if isinstance(t, torch.Tensor) and t.requires_grad)
            for _ in range(iters):
                outputs = [o for o in torch.utils._pytree.tree_leaves(fn(*args)) if o.requires_grad]
                if outputs and inputs:
                    torch.autograd.grad(
                        outputs, inputs, [torch.zeros_like(o) for o in outputs], allow_unused=allow_unused
                    )
    torch.cuda.synchronize()


def _init_fp8_states(callables, region: dict, args_list) -> None:
    """Builds the FP8 state of every TE module in the module callables now
    (modules build it lazily, at their first forward under autocast): the
    snapshot below must hold it, so that the states the warm-up and capture
    steps write are put back to their fresh values, as an eager copy has them."""
    if not (region["enabled"] or region["calibrating"]):
        return
    recipe = region["recipe"] if region["recipe"] is not None else get_default_recipe()
    for c, args in zip(callables, args_list):
        if not isinstance(c, torch.nn.Module):
            continue
        device = next((t.device for t in args if isinstance(t, torch.Tensor)), torch.device("cuda"))
        for m in c.modules():
            if callable(getattr(m, "init_fp8_metadata", None)) and isinstance(getattr(m, "fp8_meta", None), dict):
                m.init_fp8_metadata(recipe, device)


def _clone_stolen_param_grads(callables) -> None:
    """A graphed backward returns its parameter gradients in the graph's static
    buffers. Where a parameter has no .grad yet, autograd's accumulation takes
    that buffer itself as .grad, and the next replay writes into it: the next
    step's gradient is then added to itself (2x, seen on the H200) or an
    accumulated one is lost. A hook gives autograd a copy in exactly that case
    (a parameter that has a .grad is accumulated into in place: no copy)."""
    for c in callables:
        if not isinstance(c, torch.nn.Module):
            continue
        for p in c.parameters():
            if p.requires_grad:
                p.register_hook(_clone_if_no_grad(weakref.ref(p)))


def _clone_if_no_grad(ref):
    def hook(grad):
        p = ref()
        return grad.clone() if p is not None and p.grad is None else grad

    return hook


def _snapshot_fp8_states(callables) -> list:
    """(tensor, copy) of every delayed-scaling scale and amax history in the
    module callables: warm-up and capture run steps (the capture's only in
    Python, its kernels are recorded, not run) that must leave no trace, so
    that the first replay starts from the state the modules had."""
    saved = []
    for c in callables:
        if not isinstance(c, torch.nn.Module):
            continue
        for m in c.modules():
            meta = getattr(m, "fp8_meta", None)
            if not isinstance(meta, dict):
                continue
            for key in ("scaling_fwd", "scaling_bwd"):
                state = meta.get(key)
                for name in ("scale", "amax_history"):
                    t = getattr(state, name, None)
                    if isinstance(t, torch.Tensor):
                        saved.append((t, t.clone()))
    return saved


def _restore_fp8_states(saved: list) -> None:
    for t, copy in saved:
        t.copy_(copy)
