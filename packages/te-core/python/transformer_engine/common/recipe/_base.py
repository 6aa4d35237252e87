"""Building blocks of the recipes: formats, GEMM/quantizer parameters, the
Recipe base class, and the field checks every recipe shares."""

from __future__ import annotations

import dataclasses
import math
import numbers
from enum import Enum, EnumMeta
from typing import Any, NamedTuple

BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


class RecipeValidationError(ValueError, AssertionError):
    """A recipe field has a value the recipe does not allow.

    It is a ValueError (what a bad argument raises in Python) and also an
    AssertionError, because the reference library checks recipes with
    ``assert``: code written against it that catches AssertionError still
    works, and the checks run under ``python -O`` too.
    """


def fail(owner: str, message: str) -> None:
    raise RecipeValidationError(f"{owner}: {message}")


def refuse_type(owner: str, name: str, expected: str, value: Any) -> None:
    raise TypeError(f"{owner}: {name} must be {expected}, got {value!r} ({type(value).__name__})")


def _refuse_setattr(self, name: str, value: Any) -> None:
    owner = type(self).__name__
    raise dataclasses.FrozenInstanceError(
        f"{owner} is frozen: cannot set {name!r}. Make a changed copy with dataclasses.replace(obj, {name}=...)"
    )


def _refuse_delattr(self, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"{type(self).__name__} is frozen: cannot delete {name!r}")


def frozen(*, repr: bool = True):
    """dataclass(frozen=True) whose assignment error says how to make a copy."""

    def wrap(cls):
        cls = dataclasses.dataclass(frozen=True, repr=repr)(cls)
        cls.__setattr__ = _refuse_setattr
        cls.__delattr__ = _refuse_delattr
        return cls

    return wrap


def derived():
    """A field that __post_init__ computes from the others. It is no
    constructor argument, so dataclasses.replace recomputes it."""
    return dataclasses.field(init=False, compare=False)


def set_field(obj: Any, name: str, value: Any) -> None:
    """Stores a normalized or derived value while __post_init__ runs."""
    object.__setattr__(obj, name, value)


def check_bool(obj: Any, name: str) -> None:
    """bool fields also take the ints 0 and 1 (flags often come from configs)."""
    value = getattr(obj, name)
    if isinstance(value, bool):
        return
    if isinstance(value, numbers.Integral) and value in (0, 1):
        set_field(obj, name, bool(value))
        return
    refuse_type(type(obj).__name__, name, "a bool", value)


def check_non_negative(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        refuse_type(type(obj).__name__, name, "a real number", value)
    if not (math.isfinite(value) and value >= 0):
        fail(type(obj).__name__, f"{name} must be finite and >= 0, got {value!r}")


def check_int(obj: Any, name: str, minimum: int) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        refuse_type(type(obj).__name__, name, "an int", value)
    if value < minimum:
        fail(type(obj).__name__, f"{name} must be >= {minimum}, got {value!r}")
    set_field(obj, name, int(value))


def check_choice(obj: Any, name: str, choices: tuple, env: str | None = None) -> None:
    value = getattr(obj, name)
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        origin = f" (its default comes from {env})" if env else ""
        fail(type(obj).__name__, f"{name} must be one of {listed}{origin}, got {value!r}")


def check_backward_override(obj: Any) -> None:
    check_choice(obj, "backward_override", BACKWARD_OVERRIDES, env="NVTE_BACKWARD_OVERRIDE")


class FormatLimits(NamedTuple):
    """Largest finite value of the forward and of the backward format."""

    max_fwd: float
    max_bwd: float


class _ListingEnumMeta(EnumMeta):
    """An Enum whose unknown member names (Format.E4M4) fail with the valid names listed."""

    def __getattr__(cls, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"{cls.__name__} has no member {name!r}; valid names: {', '.join(cls.__members__)}")


class Format(Enum, metaclass=_ListingEnumMeta):
    """Low-precision element formats of a recipe; ``.value`` gives their maxima.

    Members:
        E2M1:   FP4 (NVFP4 data), max 6.
        E4M3:   FP8 float8_e4m3fn, max 448, for every tensor.
        E5M2:   FP8 float8_e5m2, max 57344. Pure E5M2 training is not supported:
                FP8 recipes reject it.
        HYBRID: E4M3 for forward tensors (input, weight, output) and E5M2 for
                backward tensors (grad_output, grad_input).
    """

    E2M1 = FormatLimits(max_fwd=6, max_bwd=6)
    E4M3 = FormatLimits(max_fwd=448, max_bwd=448)
    E5M2 = FormatLimits(max_fwd=57344, max_bwd=57344)
    HYBRID = FormatLimits(max_fwd=448, max_bwd=57344)


def check_format(obj: Any, name: str, allowed: tuple | None = None) -> None:
    """A Format field; with ``allowed``, one of those members."""
    value = getattr(obj, name)
    owner = type(obj).__name__
    if not isinstance(value, Format):
        refuse_type(owner, name, "a transformer_engine.common.recipe.Format", value)
    if value is Format.E5M2 and allowed is not None and Format.E5M2 not in allowed:
        fail(owner, f"{name}=Format.E5M2: Pure E5M2 training is not supported (use Format.HYBRID for E5M2 gradients)")
    if allowed is not None and value not in allowed:
        listed = " or ".join(f"Format.{f.name}" for f in allowed)
        fail(owner, f"{name} must be {listed}, got Format.{value.name}")


FP8_FORMATS = (Format.E4M3, Format.HYBRID)


@frozen()
class MMParams:
    """Options of one GEMM.

    use_split_accumulator: FP8 GEMMs on Hopper/Ada accumulate exactly in FP32
    (True) or use cuBLASLt's faster, less precise FP8 accumulation (False;
    CUBLASLT_MATMUL_DESC_FAST_ACCUM).
    """

    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        check_bool(self, "use_split_accumulator")


@frozen()
class QParams:
    """Options of one quantizer.

    Fields:
        power_2_scale:             round each scale down to a power of 2.
        amax_epsilon:              amax is raised to at least this before the
                                   scale is computed (scale = fp8_max / max(amax, eps)).
        random_hadamard_transform: NVFP4: apply the 16x16 random Hadamard transform.
        stochastic_rounding:       NVFP4: round stochastically instead of to nearest.
        fp4_2d_quantization:       NVFP4: 16x16 blocks instead of 1x16.
    """

    power_2_scale: bool = False
    amax_epsilon: float = 0.0
    random_hadamard_transform: bool = False
    stochastic_rounding: bool = False
    fp4_2d_quantization: bool = False

    def __post_init__(self) -> None:
        for name in ("power_2_scale", "random_hadamard_transform", "stochastic_rounding", "fp4_2d_quantization"):
            check_bool(self, name)
        check_non_negative(self, "amax_epsilon")


GEMMS = ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad")


def check_mm_params(obj: Any) -> None:
    for name in GEMMS:
        value = getattr(obj, name)
        if not isinstance(value, MMParams):
            refuse_type(type(obj).__name__, name, "an MMParams", value)


FP8_QUANT = ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")


def set_fp8_quant(obj: Any, power_2_scale: bool) -> None:
    """The derived fp8_quant_* fields: one QParams for input, weight and grad."""
    qparams = QParams(power_2_scale=power_2_scale, amax_epsilon=0.0)
    for name in FP8_QUANT:
        set_field(obj, name, qparams)


def fp8_repr(obj: Any, middle: tuple = ()) -> tuple:
    """repr items shared by the recipes with fp8_quant_* and fp8_gemm_* fields."""
    names = (*FP8_QUANT, *middle, *GEMMS, "fp8_dpa", "fp8_mha", "backward_override")
    return (("format", obj.fp8_format.name), *((n, getattr(obj, n)) for n in names))


class Recipe:
    """Base class of the quantization recipes.

    The kind predicates (``delayed()``, ``mxfp8()``, ...) are classmethods, as
    in the reference library: ``DelayedScaling.delayed()`` and
    ``recipe.delayed()`` on an instance both answer whether the class is (a
    subclass of) that recipe.

    Recipes are frozen dataclasses: equal field values make equal, hashable
    recipes (a callable field is compared by identity). Change one with
    ``dataclasses.replace(recipe, field=value)``.
    """

    # Which kind of recipe a class is; set by each recipe class, inherited by
    # its subclasses (so the predicates behave like issubclass checks).
    _kind = ""

    @classmethod
    def delayed(cls) -> bool:
        """Per-tensor FP8 with delayed scaling (DelayedScaling)."""
        return cls._kind == "delayed"

    @classmethod
    def float8_current_scaling(cls) -> bool:
        """Per-tensor FP8 with current scaling (Float8CurrentScaling)."""
        return cls._kind == "current"

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        """Either per-tensor FP8 recipe (delayed or current scaling)."""
        return cls._kind in ("delayed", "current")

    @classmethod
    def float8_block_scaling(cls) -> bool:
        """FP8 with 1x128 / 128x128 blocks (Float8BlockScaling)."""
        return cls._kind == "block"

    @classmethod
    def mxfp8(cls) -> bool:
        """MXFP8: FP8 with E8M0 scales per 32 elements (MXFP8BlockScaling)."""
        return cls._kind == "mxfp8"

    @classmethod
    def nvfp4(cls) -> bool:
        """NVFP4: E2M1 with E4M3 scales per 16 elements (NVFP4BlockScaling)."""
        return cls._kind == "nvfp4"

    @classmethod
    def custom(cls) -> bool:
        """User-provided quantizers (CustomRecipe)."""
        return cls._kind == "custom"

    def _repr_fields(self) -> tuple:
        """(name, text) pairs shown by repr, after recipe_type."""
        return ()

    def __repr__(self) -> str:
        # Frozen, so the text never goes stale; the cache keeps repeated
        # str(recipe) calls (logging, cache keys) cheap.
        text = self.__dict__.get("_cached_repr")
        if text is None:
            parts = [f"recipe_type={type(self).__name__}"]
            parts += [f"{name}={value}" for name, value in self._repr_fields()]
            text = ", ".join(parts)
            object.__setattr__(self, "_cached_repr", text)
        return text
