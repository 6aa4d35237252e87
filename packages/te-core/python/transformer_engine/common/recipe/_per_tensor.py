"""Per-tensor FP8 recipes: DelayedScaling and Float8CurrentScaling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field

from .. import _env
from ._base import (
    FP8_FORMATS,
    Format,
    MMParams,
    QParams,
    Recipe,
    check_backward_override,
    check_bool,
    check_format,
    check_int,
    check_mm_params,
    check_non_negative,
    derived,
    fail,
    fp8_repr,
    frozen,
    refuse_type,
    set_fp8_quant,
)

AMAX_COMPUTE_ALGOS = ("max", "most_recent")


@frozen(repr=False)
class DelayedScaling(Recipe):
    """Per-tensor FP8 scaled with the amax history of earlier steps.

    Each step quantizes with the scale computed after the previous one, and
    records the tensor's amax. After the step the history of the last
    ``amax_history_len`` amaxes rolls and the scale becomes

        scale = (fp8_max / amax) / 2^margin

    with amax the history's maximum ("max") or its newest entry
    ("most_recent"); an amax of 0, inf or NaN keeps the old scale
    (core/include/te/recipe.h gives the exact rule).

    Fields:
        margin:                      >= 0, the power-of-2 headroom above.
        fp8_format:                  Format.HYBRID (default) or Format.E4M3.
        amax_history_len:            >= 1.
        amax_compute_algo:           "max", "most_recent", or a callable
                                     amax_history -> amax (framework tensors).
        scaling_factor_compute_algo: None, or a callable
                                     (amax, old_scale, fp8_max, recipe) -> scale.
        reduce_amax:                 all-reduce (MAX) amaxes over the autocast group.
        fp8_dpa, fp8_mha:            FP8 attention (beta).
        backward_override:           must be None for this recipe (the default comes
                                     from NVTE_BACKWARD_OVERRIDE, so setting that
                                     variable makes DelayedScaling() fail).
    """

    _kind = "delayed"

    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str | Callable = "max"
    scaling_factor_compute_algo: Callable | None = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_env.backward_override)

    def __post_init__(self) -> None:
        check_non_negative(self, "margin")
        check_format(self, "fp8_format", FP8_FORMATS)
        check_int(self, "amax_history_len", minimum=1)
        algo = self.amax_compute_algo
        if not callable(algo) and algo not in AMAX_COMPUTE_ALGOS:
            fail(
                "DelayedScaling",
                f"amax_compute_algo must be 'max', 'most_recent' or a callable(amax_history) -> amax, got {algo!r}",
            )
        sf_algo = self.scaling_factor_compute_algo
        if sf_algo is not None and not callable(sf_algo):
            refuse_type(
                "DelayedScaling",
                "scaling_factor_compute_algo",
                "None or a callable(amax, old_scale, fp8_max, recipe) -> scale",
                sf_algo,
            )
        for name in ("reduce_amax", "fp8_dpa", "fp8_mha"):
            check_bool(self, name)
        check_backward_override(self)
        if self.backward_override is not None:
            fail(
                "DelayedScaling",
                "backward_override must be None: delayed scaling supports no "
                f"backward override (got {self.backward_override!r}; its "
                "default comes from NVTE_BACKWARD_OVERRIDE)",
            )

    def _repr_fields(self) -> tuple:
        return (
            ("margin", self.margin),
            ("format", self.fp8_format.name),
            ("amax_history_len", self.amax_history_len),
            ("reduce_amax", self.reduce_amax),
            ("fp8_dpa", self.fp8_dpa),
            ("fp8_mha", self.fp8_mha),
            ("backward_override", self.backward_override),
        )


@frozen(repr=False)
class Float8CurrentScaling(Recipe):
    """Per-tensor FP8 scaled from the tensor's own amax at each cast.

        scale = fp8_max / max(amax, amax_epsilon)     (1 when amax is 0, inf or NaN)

    rounded down to a power of 2 when ``use_power_2_scales``.

    Fields:
        use_power_2_scales: default from NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES.
        fp8_format:         Format.HYBRID (default) or Format.E4M3.
        fp8_gemm_fprop/dgrad/wgrad: GEMM options; fprop uses fast accumulation
                            (use_split_accumulator=False) by default.
        fp8_dpa, fp8_mha:   FP8 attention (beta).
        backward_override:  None, "high_precision" (backward uses the original
                            high-precision operands) or "dequantized" (backward
                            uses the saved FP8 operands dequantized); default
                            from NVTE_BACKWARD_OVERRIDE.

    Derived (not constructor arguments): fp8_quant_fwd_inp,
    fp8_quant_fwd_weight, fp8_quant_bwd_grad =
    QParams(power_2_scale=use_power_2_scales, amax_epsilon=0.0).
    """

    _kind = "current"

    use_power_2_scales: bool = field(default_factory=_env.fp8_current_scaling_power_2_scales)
    fp8_format: Format = Format.HYBRID
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_env.backward_override)
    fp8_quant_fwd_inp: QParams = derived()
    fp8_quant_fwd_weight: QParams = derived()
    fp8_quant_bwd_grad: QParams = derived()

    def __post_init__(self) -> None:
        for name in ("use_power_2_scales", "fp8_dpa", "fp8_mha"):
            check_bool(self, name)
        check_format(self, "fp8_format", FP8_FORMATS)
        check_mm_params(self)
        check_backward_override(self)
        set_fp8_quant(self, power_2_scale=self.use_power_2_scales)

    def _repr_fields(self) -> tuple:
        return fp8_repr(self)
