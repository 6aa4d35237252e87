"""Block-scaled recipes: MXFP8BlockScaling, Float8BlockScaling, NVFP4BlockScaling."""

from __future__ import annotations

from dataclasses import field

from .. import _env
from ._base import (
    FP8_FORMATS,
    GEMMS,
    Format,
    MMParams,
    QParams,
    Recipe,
    check_backward_override,
    check_bool,
    check_choice,
    check_format,
    check_mm_params,
    check_non_negative,
    derived,
    fail,
    fp8_repr,
    frozen,
    refuse_type,
    set_field,
    set_fp8_quant,
)

NVFP4_4OVER6_SCOPES = ("none", "weights", "activations", "all")
NVFP4_4OVER6_ERR_MODES = ("MAE", "MSE")
BLOCK_DIMS = ("x_block_scaling_dim", "w_block_scaling_dim", "grad_block_scaling_dim")


@frozen(repr=False)
class MXFP8BlockScaling(Recipe):
    """MXFP8: FP8 data with one E8M0 (power-of-2) scale per 32 consecutive
    elements (1x32 rowwise, 32x1 columnwise, each quantized from the
    high-precision tensor).

        scale_inv = 2^ceil(log2(block_amax / fp8_max)),  q = saturate(x / scale_inv)

    Fields:
        margin:                 accepted as in the reference; E8M0 block scales do not use it.
        fp8_format:             Format.E4M3 (default) or Format.HYBRID.
        fp8_dpa, fp8_mha:       FP8 attention (beta).
        backward_override:      None, "high_precision" or "dequantized"; default
                                from NVTE_BACKWARD_OVERRIDE.
        enable_2d_quantization: 32x32 blocks for Linear/GroupedLinear weights in
                                the forward pass.
    """

    _kind = "mxfp8"

    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_env.backward_override)
    enable_2d_quantization: bool = False

    def __post_init__(self) -> None:
        check_non_negative(self, "margin")
        check_format(self, "fp8_format", FP8_FORMATS)
        for name in ("fp8_dpa", "fp8_mha", "enable_2d_quantization"):
            check_bool(self, name)
        check_backward_override(self)

    def _repr_fields(self) -> tuple:
        return (
            ("margin", self.margin),
            ("format", self.fp8_format.name),
            ("enable_2d_quantization", self.enable_2d_quantization),
            ("backward_override", self.backward_override),
        )


@frozen(repr=False)
class Float8BlockScaling(Recipe):
    """FP8 with FP32 scales per block (DeepSeek-v3 style): 1x128 blocks
    (128x1 columnwise) for 1D, 128x128 for 2D.

        scale = fp8_max / max(block_amax, amax_epsilon)   (1 when amax is 0, inf or NaN)

    rounded down to a power of 2 unless ``use_f32_scales``.

    Fields:
        use_f32_scales:  default from NVTE_FP8_BLOCK_SCALING_FP32_SCALES.
        fp8_format:      Format.E4M3 (default) or Format.HYBRID.
        x_block_scaling_dim, w_block_scaling_dim, grad_block_scaling_dim:
                         1 or 2 (defaults 1, 2, 1); no GEMM may pair two 2D operands.
        fp8_gemm_fprop/dgrad/wgrad: must keep use_split_accumulator=True.
        fp8_dpa, fp8_mha: must be False (no FP8 attention with this recipe).
        backward_override: None, "high_precision" or "dequantized"; default from
                         NVTE_BACKWARD_OVERRIDE.

    Derived: fp8_quant_fwd_inp, fp8_quant_fwd_weight, fp8_quant_bwd_grad =
    QParams(power_2_scale=not use_f32_scales, amax_epsilon=0.0).
    """

    _kind = "block"

    use_f32_scales: bool = field(default_factory=_env.fp8_block_scaling_fp32_scales)
    fp8_format: Format = Format.E4M3
    x_block_scaling_dim: int = 1
    w_block_scaling_dim: int = 2
    grad_block_scaling_dim: int = 1
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_env.backward_override)
    fp8_quant_fwd_inp: QParams = derived()
    fp8_quant_fwd_weight: QParams = derived()
    fp8_quant_bwd_grad: QParams = derived()

    def __post_init__(self) -> None:
        for name in ("use_f32_scales", "fp8_dpa", "fp8_mha"):
            check_bool(self, name)
        check_format(self, "fp8_format", FP8_FORMATS)
        dims = BLOCK_DIMS
        for name in dims:
            value = getattr(self, name)
            if isinstance(value, bool) or value not in (1, 2):
                fail("Float8BlockScaling", f"{name} must be 1 or 2 (1D or 2D blocks), got {value!r}")
        # Each GEMM multiplies two of x, w, grad (fprop x.w, dgrad grad.w,
        # wgrad grad.x); a GEMM of two 2D-scaled operands is not supported.
        for i, a in enumerate(dims):
            for b in dims[i + 1 :]:
                if getattr(self, a) == 2 and getattr(self, b) == 2:
                    fail("Float8BlockScaling", f"2D by 2D block GEMMs are not supported: {a}=2 and {b}=2")
        check_mm_params(self)
        for name in GEMMS:
            if not getattr(self, name).use_split_accumulator:
                fail(
                    "Float8BlockScaling",
                    f"{name}.use_split_accumulator must be True: FP8 block scaling requires the split accumulator",
                )
        if self.fp8_dpa or self.fp8_mha:
            fail("Float8BlockScaling", "FP8 attention is not supported: fp8_dpa and fp8_mha must be False")
        check_backward_override(self)
        set_fp8_quant(self, power_2_scale=not self.use_f32_scales)

    def _repr_fields(self) -> tuple:
        return fp8_repr(self, BLOCK_DIMS)


@frozen(repr=False)
class NVFP4BlockScaling(Recipe):
    """NVFP4: E2M1 data, one E4M3 scale per 16 elements (16x16 for weights by
    default) and one FP32 factor per tensor:

        S_enc = (448 * 6) / global_amax,  block scale = e4m3(block_amax * S_enc / 6)
        x ~= q * block_scale / S_enc

    Fields:
        disable_rht:                 no random Hadamard transform (default from
                                     NVTE_NVFP4_DISABLE_RHT); RHT applies to the
                                     columnwise (wgrad) input and gradient.
        disable_stochastic_rounding: gradients rounded to nearest (default from
                                     NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING).
        disable_2d_quantization:     1x16 weight blocks (default from
                                     NVTE_NVFP4_DISABLE_2D_QUANTIZATION).
        row_scaled_activation:       one FP32 amax per row for forward activations
                                     (default from NVTE_NVFP4_ROW_SCALED_ACTIVATION);
                                     needs a backward_override.
        nvfp4_4over6:                "none", "weights", "activations" or "all"
                                     (NVTE_NVFP4_4OVER6).
        nvfp4_4over6_e4m3_use_256:   same choices, default "all"
                                     (NVTE_NVFP4_4OVER6_E4M3_USE_256).
        nvfp4_4over6_err_mode:       "MAE" or "MSE" (NVTE_NVFP4_4OVER6_ERR_MODE).
        fp4_format, fp8_format:      must be Format.E2M1 and Format.E4M3.
        fp8_dpa, fp8_mha:            FP8 attention (beta).
        backward_override:           None, "high_precision" or "dequantized".

    Derived QParams: fp4_quant_fwd_inp (RHT = not disable_rht),
    fp4_quant_fwd_weight (2D = not disable_2d_quantization) and
    fp4_quant_bwd_grad (RHT = not disable_rht, stochastic rounding = not
    disable_stochastic_rounding).
    """

    _kind = "nvfp4"

    disable_rht: bool = field(default_factory=_env.nvfp4_disable_rht)
    disable_stochastic_rounding: bool = field(default_factory=_env.nvfp4_disable_stochastic_rounding)
    disable_2d_quantization: bool = field(default_factory=_env.nvfp4_disable_2d_quantization)
    row_scaled_activation: bool = field(default_factory=_env.nvfp4_row_scaled_activation)
    nvfp4_4over6: str = field(default_factory=_env.nvfp4_4over6)
    nvfp4_4over6_e4m3_use_256: str = field(default_factory=_env.nvfp4_4over6_e4m3_use_256)
    nvfp4_4over6_err_mode: str = field(default_factory=_env.nvfp4_4over6_err_mode)
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_env.backward_override)
    fp4_quant_fwd_inp: QParams = derived()
    fp4_quant_fwd_weight: QParams = derived()
    fp4_quant_bwd_grad: QParams = derived()

    def __post_init__(self) -> None:
        for name in (
            "disable_rht",
            "disable_stochastic_rounding",
            "disable_2d_quantization",
            "row_scaled_activation",
            "fp8_dpa",
            "fp8_mha",
        ):
            check_bool(self, name)
        check_format(self, "fp4_format", (Format.E2M1,))
        check_format(self, "fp8_format", (Format.E4M3,))
        for name in ("nvfp4_4over6", "nvfp4_4over6_err_mode", "nvfp4_4over6_e4m3_use_256"):
            if not isinstance(getattr(self, name), str):
                refuse_type("NVFP4BlockScaling", name, "a str", getattr(self, name))
        check_choice(self, "nvfp4_4over6", NVFP4_4OVER6_SCOPES, env="NVTE_NVFP4_4OVER6")
        check_choice(self, "nvfp4_4over6_e4m3_use_256", NVFP4_4OVER6_SCOPES, env="NVTE_NVFP4_4OVER6_E4M3_USE_256")
        check_choice(self, "nvfp4_4over6_err_mode", NVFP4_4OVER6_ERR_MODES, env="NVTE_NVFP4_4OVER6_ERR_MODE")
        check_backward_override(self)
        if self.row_scaled_activation and self.backward_override is None:
            fail(
                "NVFP4BlockScaling",
                "row_scaled_activation=True requires backward_override 'high_precision' or 'dequantized', got None",
            )
        set_field(self, "fp4_quant_fwd_inp", QParams(random_hadamard_transform=not self.disable_rht))
        set_field(self, "fp4_quant_fwd_weight", QParams(fp4_2d_quantization=not self.disable_2d_quantization))
        set_field(
            self,
            "fp4_quant_bwd_grad",
            QParams(
                random_hadamard_transform=not self.disable_rht,
                stochastic_rounding=not self.disable_stochastic_rounding,
            ),
        )

    def _repr_fields(self) -> tuple:
        return (
            ("fp4_format", self.fp4_format.name),
            ("fp8_format", self.fp8_format.name),
            ("fp8_dpa", self.fp8_dpa),
            ("fp8_mha", self.fp8_mha),
            ("backward_override", self.backward_override),
            ("row_scaled_activation", self.row_scaled_activation),
            ("nvfp4_4over6", self.nvfp4_4over6),
            ("nvfp4_4over6_e4m3_use_256", self.nvfp4_4over6_e4m3_use_256),
            ("nvfp4_4over6_err_mode", self.nvfp4_4over6_err_mode),
            ("fp4_quant_fwd_inp", self.fp4_quant_fwd_inp),
            ("fp4_quant_fwd_weight", self.fp4_quant_fwd_weight),
            ("fp4_quant_bwd_grad", self.fp4_quant_bwd_grad),
        )
