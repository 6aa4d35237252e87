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

import functools
import inspect
import types
import typing

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


def empty_outputs(specs, like: torch.Tensor) -> tuple:
    """Fresh tensors on like's device for shape-rule entries (shape, dtype),
    None for None (an output not asked for): the fake kernels' outputs, and the
    quantizers' from the same rules."""
    return tuple(_make(s, like) for s in specs)


def run_quantizer(fn, x: torch.Tensor, specs, codes, *flags) -> tuple:
    """fn(x, outputs..., *flags, stream) of a te-core block quantizer (MXFP8,
    FP8 block scaling): the outputs are fresh tensors of the shape-rule entries
    `specs` (None: not asked for) with the dtype codes `codes`. Returns them."""
    x = contiguous(x)
    outs = empty_outputs(specs, x)
    fn(hp_desc(x, "x"), *(None if t is None else desc(t, c) for t, c in zip(outs, codes)), *flags, stream_of(x))
    return outs


def run_dequantizer(fn, data, data_code: int, scale_inv, scale_code: int, out_dtype, *flags) -> torch.Tensor:
    """fn(data, scale_inv, out, *flags, stream) of a te-core dequantizer into a
    fresh out_dtype tensor of data's shape; returns it."""
    data, scale_inv = contiguous(data), contiguous(scale_inv)
    out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
    fn(desc(data, data_code), desc(scale_inv, scale_code), hp_desc(out, "out_dtype"), *flags, stream_of(data))
    return out


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


# True while torch.compile traces: the one place te-pytorch decides it. Then
# the registered torch.ops.te.* ops must be called (the tracer cannot look into
# nanobind calls) and the eager fast paths (cached descriptors, direct
# implementation calls) are skipped. (torch's function itself, not a wrapper:
# every eager op call asks.)
compiling = torch.compiler.is_compiling


# --------------------------------------------------------------------------- one definition per op
#
# An op is written once: its implementation, with annotated parameters (they
# give the schema, defaults and keyword-only markers included) and an annotated
# return, plus a shape rule for torch.compile. `te_op` derives from them the
# registered torch.ops.te.<name>, its fake kernel and the public function.
#
# Parameters that several ops share are written once too, as a NamedTuple
# (field annotations and defaults), in one of two ways:
# - a parameter `a: Group` is one argument, a Group (or a plain tuple in its
#   order); the op takes its fields as a_<field> (attention's AttentionConfig);
# - `**name: Unpack[Group]` stands for the fields as keyword-only parameters
#   of the same names and defaults (gemm's GemmOptions): callers pass them as
#   any keyword, the public signature lists them, the op takes them after the
#   other keyword-only ones. impl gets the ones given as the dict `name` and
#   makes Group(**name) of it: defaults filled, unknown keywords refused. That
#   costs an eager call about 0.5 us, up to 1.4 us with six given (CPU, gemm).
#
# An op that is another one with some arguments fixed, or one implementation
# under two names, takes that signature (signature_without) and passes its
# arguments on (*args, **kwargs).
#
# Return annotations: `Tensor` (always produced), `Tensor | None` (an output
# that may not be asked for) and anything else (Python-side information of the
# eager call, such as the block GEMM's path: not an op output). Ops cannot
# return None, so an output not produced is a placeholder inside the op: a
# zero-element torch.bool tensor on the op's device (no te op produces bool
# tensors, and a dtype is static while tracing, so the public function turns
# placeholders back into None without knowing why they are absent).

_TENSOR, _OPTIONAL, _INFO = "tensor", "optional", "info"
PLACEHOLDER_DTYPE = torch.bool


def placeholder(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,), dtype=PLACEHOLDER_DTYPE)


def _kind(annotation) -> str:
    if annotation is torch.Tensor:
        return _TENSOR
    return _OPTIONAL if torch.Tensor in typing.get_args(annotation) else _INFO


def _output_kinds(annotation):
    """None (no outputs), one kind (one output) or a tuple of kinds."""
    if annotation is None or annotation is type(None):
        return None
    if typing.get_origin(annotation) is tuple:
        return tuple(_kind(a) for a in typing.get_args(annotation))
    return _kind(annotation)


def _op_return(kinds):
    """The registered op's return annotation: the tensor outputs only."""
    if kinds is None or kinds == _INFO:
        return None
    n = 1 if isinstance(kinds, str) else sum(k != _INFO for k in kinds)
    return torch.Tensor if n == 1 else tuple[(torch.Tensor,) * n]


def _to_op(result, kinds, like):
    """The implementation's result as the op returns it (placeholders, no info)."""
    if kinds is None or kinds == _INFO:
        return None
    if isinstance(kinds, str):
        return placeholder(like) if result is None else result
    out = tuple(placeholder(like) if r is None else r for r, k in zip(result, kinds) if k != _INFO)
    return out[0] if len(out) == 1 else out


def _from_op(result, kinds):
    """The op's result as the public function returns it (None for placeholders and info)."""
    if kinds is None or kinds == _INFO:
        return None
    if isinstance(kinds, str):
        return None if kinds == _OPTIONAL and result.dtype == PLACEHOLDER_DTYPE else result
    if sum(k != _INFO for k in kinds) == 1:
        result = (result,)
    out, i = [], 0
    for k in kinds:
        if k == _INFO:
            out.append(None)
            continue
        r = result[i]
        i += 1
        out.append(None if k == _OPTIONAL and r.dtype == PLACEHOLDER_DTYPE else r)
    return tuple(out)


def _make(spec, like):
    """A fake output from a shape rule's (shape, dtype) or None."""
    return None if spec is None else like.new_empty(tuple(spec[0]), dtype=spec[1])


def _group_fields(annotation):
    """[(field, annotation)] of a NamedTuple parameter type (a group of op
    arguments such as a block GEMM operand), else None."""
    if isinstance(annotation, type) and issubclass(annotation, tuple) and hasattr(annotation, "_fields"):
        hints = typing.get_type_hints(annotation)
        return [(f, hints[f]) for f in annotation._fields]
    return None


def _keyword_group(p: inspect.Parameter):
    """Group of a parameter `**name: Unpack[Group]` (Group a NamedTuple), else None."""
    if p.kind != p.VAR_KEYWORD or typing.get_origin(p.annotation) is not typing.Unpack:
        return None
    (group,) = typing.get_args(p.annotation)
    if _group_fields(group) is None:
        raise TypeError(f"**{p.name}: Unpack[...] takes a NamedTuple, got {group!r}")
    return group


def _expanded(sig: inspect.Signature) -> inspect.Signature:
    """sig with `**name: Unpack[Group]` written out: one keyword-only parameter
    per field of Group, with its annotation and default (the public signature)."""
    P = inspect.Parameter
    params = []
    for p in sig.parameters.values():
        group = _keyword_group(p)
        if group is None:
            params.append(p)
            continue
        defaults = group._field_defaults
        params += [
            P(f, P.KEYWORD_ONLY, default=defaults.get(f, P.empty), annotation=t) for f, t in _group_fields(group)
        ]
    return sig.replace(parameters=params)


def _op_signature(sig: inspect.Signature) -> inspect.Signature:
    """impl's signature as the op's. A NamedTuple parameter `a` becomes one
    parameter a_<field> per field. torch.library takes no keyword-only tensors,
    so keyword-only parameters become positional ones after the others (the
    required ones first). The public function keeps impl's signature."""
    P = inspect.Parameter
    positional, keyword = [], []
    for p in sig.parameters.values():
        fields = _group_fields(p.annotation)
        if fields is None:
            (keyword if p.kind == P.KEYWORD_ONLY else positional).append(p)
        else:
            positional += [P(f"{p.name}_{f}", P.POSITIONAL_OR_KEYWORD, annotation=t) for f, t in fields]
    keyword.sort(key=lambda p: p.default is not P.empty)
    ordered = positional + [p.replace(kind=P.POSITIONAL_OR_KEYWORD) for p in keyword]
    return sig.replace(parameters=ordered, return_annotation=_op_return(_output_kinds(sig.return_annotation)))


def _required_through_mutated(sig: inspect.Signature, mutated) -> inspect.Signature:
    """The op signature with no defaults up to its last mutated parameter that
    has one (an optional `amax`). Why: a boxed call drops trailing arguments
    equal to their defaults, and torch 2.11's ADInplaceOrView kernel of a
    custom op then indexes the mutated one past the end (IndexError under
    torch.compile and opcheck; 2.13 checks the length). Required parameters
    are never dropped; te_op's public function passes every argument."""
    params = list(sig.parameters.values())
    last = max((i for i, p in enumerate(params) if p.name in mutated and p.default is not p.empty), default=-1)
    if last < 0:
        return sig
    return sig.replace(parameters=[p.replace(default=p.empty) for p in params[: last + 1]] + params[last + 1 :])


class _Definition:
    """What te_op reads from one implementation: how its arguments map to the
    op's (groups flattened, keyword-only ones positional) and what it returns."""

    def __init__(self, impl, signature=None, mutated=()):
        self.sig = _expanded(inspect.signature(impl, eval_str=True) if signature is None else signature)
        self.kinds = _output_kinds(self.sig.return_annotation)
        with_defaults = _op_signature(self.sig)
        self.op_sig = _required_through_mutated(with_defaults, mutated)
        P = inspect.Parameter
        params = list(self.sig.parameters.values())
        self.n_positional = sum(p.kind != P.KEYWORD_ONLY for p in params)
        self.groups = {i: p.name for i, p in enumerate(params) if _group_fields(p.annotation) is not None}
        op_params = list(with_defaults.parameters.values())
        self.op_params = tuple((p.name, p.default) for p in op_params)  # (impl's defaults, to fill calls)
        n_keyword = len(params) - self.n_positional  # (impl's keyword-only ones: the op's last, reordered)
        self.keyword_names = [p.name for p in op_params[len(op_params) - n_keyword :]]
        tensors = [i for i, p in enumerate(op_params) if p.annotation is torch.Tensor]
        self.like = (tensors[0], op_params[tensors[0]].name) if tensors else None

    def positional(self, args, kwargs) -> tuple:
        """An op call's arguments all positional, defaults filled (plain tuple and
        dict work: torch.compile traces this, and cannot trace Signature.bind)."""
        if len(args) == len(self.op_params):
            return tuple(args)
        out = list(args)
        for name, default in self.op_params[len(args) :]:
            out.append(kwargs[name] if name in kwargs else default)
        return tuple(out)

    def like_of(self, args, kwargs):
        """The first tensor argument of an op call: where outputs and placeholders go."""
        if self.like is None:
            return None
        index, name = self.like
        return args[index] if index < len(args) else kwargs[name]

    def flatten(self, args, kwargs):
        """A public call's arguments as the op's (groups spread into their fields)."""
        if not self.groups:
            return args, kwargs
        flat = []
        for i, value in enumerate(args):
            if i in self.groups:
                flat.extend(value)
            else:
                flat.append(value)
        for name in self.groups.values():
            if name in kwargs:
                group = kwargs.pop(name)
                kwargs.update((f"{name}_{f}", v) for (f, _), v in zip(_group_fields(self._ann(name)), group))
        return tuple(flat), kwargs

    def _ann(self, name):
        return self.sig.parameters[name].annotation

    def impl_arguments(self, args, kwargs) -> dict:
        """An op call's arguments as impl's, by name (defaults applied, groups rebuilt)."""
        bound = self.op_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        out = {}
        for name, p in self.sig.parameters.items():
            fields = _group_fields(p.annotation)
            if fields is None:
                out[name] = values[name]
            else:
                out[name] = p.annotation(*(values[f"{name}_{f}"] for f, _ in fields))
        return out

    def impl_call(self, impl, args, kwargs):
        """impl called with an op call's arguments."""
        if self.groups:
            return impl(**self.impl_arguments(args, kwargs))
        if len(args) > self.n_positional:  # (the dispatcher passes impl's keyword-only ones positionally)
            kwargs.update(zip(self.keyword_names, args[self.n_positional :]))
            args = args[: self.n_positional]
        return impl(*args, **kwargs)


def signature_without(fn, *names: str, rename=None, returns=inspect.Parameter.empty) -> inspect.Signature:
    """The signature of `fn` (te_op's public function, or an annotated
    function that an op's implementation calls) less the parameters `names`,
    with parameters renamed (rename: {old: new}) and the return annotation
    `returns` if given: the schema of an op that is another one with some
    arguments fixed (RMSNorm: LayerNorm without beta) or one implementation
    under two names (RoPE forward and backward), for te_op(signature=...)."""
    rename = rename or {}
    sig = inspect.signature(fn, eval_str=True)
    params = [p.replace(name=rename.get(p.name, p.name)) for p in sig.parameters.values() if p.name not in names]
    sig = sig.replace(parameters=params)
    return sig if returns is inspect.Parameter.empty else sig.replace(return_annotation=returns)


_DEFINITIONS: dict[str, _Definition] = {}


def op_arguments(name: str, args: tuple, kwargs: dict) -> tuple:
    """A call of torch.ops.te.<name> with op-level arguments, all positional
    and defaults filled (the op's schema may have none: _required_through_mutated)."""
    return _DEFINITIONS[name].positional(args, kwargs)


def te_op(name: str, *, mutates_args: tuple[str, ...] = (), shapes=None, signature=None):
    """Decorator: the implementation `impl` becomes the public function of op
    torch.ops.te.<name>.

    The op's schema is inferred from impl's signature (torch.library.custom_op;
    see _op_signature for NamedTuple groups and keyword-only parameters);
    `mutates_args` names the tensors it writes in place (op-level names;
    a keyword group's fields keep their names).
    `shapes(a)` is the shape rule of the fake kernel: `a` has impl's arguments
    as attributes (defaults applied) and the rule returns what impl returns,
    each tensor as (shape, dtype) (on the first tensor argument's device) and
    None where impl returns None or information (no rule: impl returns None or
    information only). The public function calls impl directly in eager mode
    (no dispatcher: tens of microseconds less per call) and the registered op
    while torch.compile traces. `signature` (see signature_without) replaces
    impl's own, for an impl that takes **kwargs on to another op's. The
    public function's signature has keyword groups written out (_expanded).
    """

    def define(impl):
        d = _Definition(impl, signature, mutates_args)
        kinds = d.kinds

        def body(*args, **kwargs):
            like = d.like_of(args, kwargs)
            return _to_op(d.impl_call(impl, args, kwargs), kinds, like)

        def fake(*args, **kwargs):
            if kinds is None or kinds == _INFO:
                return None
            specs = shapes(types.SimpleNamespace(**d.impl_arguments(args, kwargs)))
            like = d.like_of(args, kwargs)
            made = _make(specs, like) if isinstance(kinds, str) else empty_outputs(specs, like)
            return _to_op(made, kinds, like)

        body.__signature__ = d.op_sig
        body.__name__ = body.__qualname__ = f"te_{name}"
        body.__module__ = impl.__module__
        registered = torch.library.custom_op(f"te::{name}", body, mutates_args=mutates_args)
        registered.register_fake(fake)
        op = getattr(torch.ops.te, name)

        @functools.wraps(impl)
        def public(*args, **kwargs):
            if compiling():
                args, kwargs = d.flatten(args, kwargs)
                # All positional, defaults filled (see _required_through_mutated).
                return _from_op(op(*d.positional(args, kwargs)), kinds)
            return impl(*args, **kwargs)

        public.op = op
        public.__signature__ = d.sig
        _DEFINITIONS[name] = d
        return public

    return define
