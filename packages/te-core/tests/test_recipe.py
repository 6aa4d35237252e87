"""transformer_engine.common.recipe: defaults, env-backed defaults, validation,
frozenness, repr, predicates, formats."""

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest

from transformer_engine.common import _env, recipe
from transformer_engine.common.recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MMParams,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    QParams,
    QuantizerRole,
    Recipe,
    RecipeValidationError,
)

pytestmark = pytest.mark.recipe

ENV_NAMES = [var.name for var in _env.ENV_VARS]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Every test starts with none of the recipe variables set."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def qfactory(role):
    return None


RECIPE_CLASSES = [
    DelayedScaling,
    Float8CurrentScaling,
    Float8BlockScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    CustomRecipe,
]


def make(cls):
    """A default recipe of cls (built inside the test, after the env is cleaned)."""
    return cls(qfactory=qfactory) if cls is CustomRecipe else cls()


# One allowed change of a field per recipe.
CHANGE = {
    DelayedScaling: ("margin", 1),
    Float8CurrentScaling: ("fp8_dpa", True),
    Float8BlockScaling: ("fp8_format", Format.HYBRID),
    MXFP8BlockScaling: ("fp8_mha", True),
    NVFP4BlockScaling: ("disable_rht", True),
    CustomRecipe: ("quantization_alignment", 16),
}


# ---------------------------------------------------------------- formats ---


@pytest.mark.parametrize(
    "fmt, fwd, bwd",
    [
        (Format.E2M1, 6, 6),
        (Format.E4M3, 448, 448),
        (Format.E5M2, 57344, 57344),
        (Format.HYBRID, 448, 57344),
    ],
)
def test_format_values(fmt, fwd, bwd):
    assert (fmt.value.max_fwd, fmt.value.max_bwd) == (fwd, bwd)
    assert fmt.value == (fwd, bwd)
    assert Format((fwd, bwd)) is fmt  # the values are distinct: no aliases


def test_format_members():
    assert [f.name for f in Format] == ["E2M1", "E4M3", "E5M2", "HYBRID"]


# --------------------------------------------------------------- defaults ---


def test_delayed_scaling_defaults():
    r = DelayedScaling()
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (0, Format.HYBRID, 1024, "max")
    assert r.scaling_factor_compute_algo is None
    assert (r.reduce_amax, r.fp8_dpa, r.fp8_mha, r.backward_override) == (True, False, False, None)


def test_current_scaling_defaults():
    r = Float8CurrentScaling()
    assert r.use_power_2_scales is False and r.fp8_format is Format.HYBRID
    assert r.fp8_gemm_fprop == MMParams(use_split_accumulator=False)
    assert r.fp8_gemm_dgrad == MMParams(True) and r.fp8_gemm_wgrad == MMParams(True)
    for q in (r.fp8_quant_fwd_inp, r.fp8_quant_fwd_weight, r.fp8_quant_bwd_grad):
        assert q == QParams(power_2_scale=False, amax_epsilon=0.0)
    assert (r.fp8_dpa, r.fp8_mha, r.backward_override) == (False, False, None)


def test_block_scaling_defaults():
    r = Float8BlockScaling()
    assert r.use_f32_scales is False and r.fp8_format is Format.E4M3
    assert (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim) == (1, 2, 1)
    assert r.fp8_quant_fwd_inp == QParams(power_2_scale=True)
    assert all(getattr(r, g).use_split_accumulator for g in ("fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"))


def test_mxfp8_defaults():
    r = MXFP8BlockScaling()
    assert (r.margin, r.fp8_format, r.fp8_dpa, r.fp8_mha, r.backward_override, r.enable_2d_quantization) == (
        0,
        Format.E4M3,
        False,
        False,
        None,
        False,
    )


def test_nvfp4_defaults_and_derived_qparams():
    r = NVFP4BlockScaling()
    assert (r.fp4_format, r.fp8_format) == (Format.E2M1, Format.E4M3)
    assert not (r.disable_rht or r.disable_stochastic_rounding or r.disable_2d_quantization or r.row_scaled_activation)
    assert (r.nvfp4_4over6, r.nvfp4_4over6_e4m3_use_256, r.nvfp4_4over6_err_mode) == ("none", "all", "MAE")
    assert r.fp4_quant_fwd_inp == QParams(random_hadamard_transform=True)
    assert r.fp4_quant_fwd_weight == QParams(fp4_2d_quantization=True)
    assert r.fp4_quant_bwd_grad == QParams(random_hadamard_transform=True, stochastic_rounding=True)
    off = NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, disable_2d_quantization=True)
    assert off.fp4_quant_fwd_inp == off.fp4_quant_fwd_weight == off.fp4_quant_bwd_grad == QParams()


def test_custom_recipe_and_role():
    r = CustomRecipe(qfactory=qfactory)
    assert (r.fp8_format, r.quantization_alignment, r.backward_override) == (Format.HYBRID, 128, None)
    assert QuantizerRole() == QuantizerRole("", "", "")
    role = QuantizerRole(module_type="linear", tensor_type="weight", name="fc1")
    assert {role: 1}[QuantizerRole("linear", "weight", "fc1")] == 1
    with pytest.raises(TypeError, match="tensor_type must be a str"):
        QuantizerRole(tensor_type=3)


def test_qparams_mmparams_defaults():
    assert QParams() == QParams(False, 0.0, False, False, False)
    assert MMParams().use_split_accumulator is True
    assert repr(MMParams()) == "MMParams(use_split_accumulator=True)"


# ------------------------------------------------------ env-backed defaults ---


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("", False), ("true", False)])
def test_env_power_2_scales(monkeypatch, value, expected):
    monkeypatch.setenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", value)
    r = Float8CurrentScaling()
    assert r.use_power_2_scales is expected
    assert r.fp8_quant_bwd_grad.power_2_scale is expected


def test_env_read_at_construction_not_import(monkeypatch):
    before = Float8BlockScaling()
    monkeypatch.setenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "1")
    after = Float8BlockScaling()
    assert before.use_f32_scales is False and after.use_f32_scales is True
    assert after.fp8_quant_fwd_weight.power_2_scale is False
    # An explicit argument wins over the variable.
    assert Float8BlockScaling(use_f32_scales=False).use_f32_scales is False


@pytest.mark.parametrize(
    "var, attr",
    [
        ("NVTE_NVFP4_DISABLE_RHT", "disable_rht"),
        ("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING", "disable_stochastic_rounding"),
        ("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "disable_2d_quantization"),
    ],
)
def test_env_nvfp4_flags(monkeypatch, var, attr):
    monkeypatch.setenv(var, "1")
    assert getattr(NVFP4BlockScaling(), attr) is True


def test_env_nvfp4_row_scaled_and_4over6(monkeypatch):
    monkeypatch.setenv("NVTE_NVFP4_ROW_SCALED_ACTIVATION", "1")
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "dequantized")
    monkeypatch.setenv("NVTE_NVFP4_4OVER6", "weights")
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_MODE", "mse")
    r = NVFP4BlockScaling()
    assert r.row_scaled_activation and r.backward_override == "dequantized"
    assert (r.nvfp4_4over6, r.nvfp4_4over6_err_mode) == ("weights", "MSE")


@pytest.mark.parametrize("cls", [Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling])
@pytest.mark.parametrize("value", ["high_precision", "dequantized"])
def test_env_backward_override(monkeypatch, cls, value):
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", value)
    assert cls().backward_override == value
    assert CustomRecipe(qfactory).backward_override == value


def test_env_backward_override_rejected_by_delayed_scaling(monkeypatch):
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "high_precision")
    with pytest.raises(RecipeValidationError, match="backward_override must be None.*NVTE_BACKWARD_OVERRIDE"):
        DelayedScaling()


def test_env_backward_override_bad_value(monkeypatch):
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "fp32")
    with pytest.raises(
        RecipeValidationError,
        match=r"Float8CurrentScaling: backward_override "
        r"must be one of None, 'high_precision', "
        r"'dequantized' .*NVTE_BACKWARD_OVERRIDE.*'fp32'",
    ):
        Float8CurrentScaling()


def test_envvars_documented():
    doc = Path(__file__).resolve().parents[3] / "docs" / "envvars.md"
    if not doc.exists():
        pytest.skip("docs/ is not beside this checkout")
    text = doc.read_text()
    assert [name for name in ENV_NAMES if name not in text] == []


# ------------------------------------------------------------- validation ---


@pytest.mark.parametrize("cls", [DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling])
def test_pure_e5m2_rejected(cls):
    with pytest.raises(RecipeValidationError, match="Pure E5M2 training is not supported"):
        cls(fp8_format=Format.E5M2)
    with pytest.raises(AssertionError):  # what the reference library raises
        cls(fp8_format=Format.E5M2)
    with pytest.raises(RecipeValidationError, match="fp8_format must be Format.E4M3 or Format.HYBRID, got Format.E2M1"):
        cls(fp8_format=Format.E2M1)
    assert cls(fp8_format=Format.E4M3).fp8_format is Format.E4M3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"margin": -1}, "DelayedScaling: margin must be finite and >= 0, got -1"),
        ({"margin": float("nan")}, "margin must be finite"),
        ({"amax_history_len": 0}, "DelayedScaling: amax_history_len must be >= 1, got 0"),
        ({"amax_compute_algo": "mean"}, "amax_compute_algo must be 'max', 'most_recent' or a callable"),
    ],
)
def test_delayed_scaling_values(kwargs, message):
    with pytest.raises(RecipeValidationError, match=message):
        DelayedScaling(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"margin": "0"}, "margin must be a real number"),
        ({"amax_history_len": 2.0}, "amax_history_len must be an int"),
        ({"amax_history_len": True}, "amax_history_len must be an int"),
        ({"fp8_format": "HYBRID"}, "fp8_format must be a transformer_engine.common.recipe.Format"),
        ({"scaling_factor_compute_algo": 1.0}, "scaling_factor_compute_algo must be None or a callable"),
        ({"reduce_amax": "yes"}, "reduce_amax must be a bool"),
        ({"fp8_dpa": 2}, "fp8_dpa must be a bool"),
    ],
)
def test_delayed_scaling_types(kwargs, message):
    with pytest.raises(TypeError, match=message):
        DelayedScaling(**kwargs)


def test_delayed_scaling_accepts():
    def most_recent(history):
        return history[0]

    r = DelayedScaling(margin=1, amax_history_len=16, amax_compute_algo="most_recent")
    assert r.amax_compute_algo == "most_recent"
    assert DelayedScaling(amax_compute_algo=most_recent).amax_compute_algo is most_recent
    assert DelayedScaling(fp8_dpa=1).fp8_dpa is True  # 0/1 normalized to bool
    assert DelayedScaling(margin=0.5).margin == 0.5


@pytest.mark.parametrize(
    "dims, message",
    [
        ({"x_block_scaling_dim": 3}, "x_block_scaling_dim must be 1 or 2 .*got 3"),
        ({"w_block_scaling_dim": 0}, "w_block_scaling_dim must be 1 or 2"),
        ({"grad_block_scaling_dim": True}, "grad_block_scaling_dim must be 1 or 2"),
        (
            {"x_block_scaling_dim": 2},
            ("2D by 2D block GEMMs are not supported: x_block_scaling_dim=2 and w_block_scaling_dim=2"),
        ),
        (
            {"w_block_scaling_dim": 1, "x_block_scaling_dim": 2, "grad_block_scaling_dim": 2},
            "x_block_scaling_dim=2 and grad_block_scaling_dim=2",
        ),
        ({"grad_block_scaling_dim": 2}, "w_block_scaling_dim=2 and grad_block_scaling_dim=2"),
    ],
)
def test_block_scaling_dims(dims, message):
    with pytest.raises(RecipeValidationError, match=message):
        Float8BlockScaling(**dims)


def test_block_scaling_dims_accepted():
    r = Float8BlockScaling(x_block_scaling_dim=2, w_block_scaling_dim=1)
    assert (r.x_block_scaling_dim, r.w_block_scaling_dim) == (2, 1)


@pytest.mark.parametrize("gemm", ["fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad"])
def test_block_scaling_split_accumulator(gemm):
    with pytest.raises(RecipeValidationError, match=f"{gemm}.use_split_accumulator must be True"):
        Float8BlockScaling(**{gemm: MMParams(use_split_accumulator=False)})
    with pytest.raises(TypeError, match=f"{gemm} must be an MMParams"):
        Float8BlockScaling(**{gemm: True})


@pytest.mark.parametrize("flag", ["fp8_dpa", "fp8_mha"])
def test_block_scaling_no_fp8_attention(flag):
    with pytest.raises(RecipeValidationError, match="FP8 attention is not supported"):
        Float8BlockScaling(**{flag: True})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fp4_format": Format.E4M3}, "fp4_format must be Format.E2M1, got Format.E4M3"),
        ({"fp8_format": Format.HYBRID}, "fp8_format must be Format.E4M3, got Format.HYBRID"),
        (
            {"nvfp4_4over6": "some"},
            ("nvfp4_4over6 must be one of 'none', 'weights', 'activations', 'all' .*NVTE_NVFP4_4OVER6.*'some'"),
        ),
        ({"nvfp4_4over6_e4m3_use_256": "x"}, "nvfp4_4over6_e4m3_use_256 must be one of"),
        ({"nvfp4_4over6_err_mode": "L1"}, "nvfp4_4over6_err_mode must be one of 'MAE', 'MSE'"),
        ({"row_scaled_activation": True}, "row_scaled_activation=True requires backward_override"),
        ({"backward_override": "fast"}, "backward_override must be one of"),
    ],
)
def test_nvfp4_validation(kwargs, message):
    with pytest.raises(RecipeValidationError, match=message):
        NVFP4BlockScaling(**kwargs)


def test_custom_recipe_validation():
    with pytest.raises(TypeError, match="qfactory must be a callable"):
        CustomRecipe(qfactory="mxfp8")
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'qfactory'"):
        CustomRecipe()
    with pytest.raises(RecipeValidationError, match="quantization_alignment must be >= 1, got 0"):
        CustomRecipe(qfactory, quantization_alignment=0)


def test_qparams_validation():
    with pytest.raises(RecipeValidationError, match="QParams: amax_epsilon must be finite and >= 0"):
        QParams(amax_epsilon=-1e-3)
    with pytest.raises(TypeError, match="QParams: power_2_scale must be a bool"):
        QParams(power_2_scale="yes")
    with pytest.raises(TypeError, match="MMParams: use_split_accumulator must be a bool"):
        MMParams(use_split_accumulator=None)


# -------------------------------------------------- frozen, equal, hashable ---


@pytest.mark.parametrize("cls", RECIPE_CLASSES)
def test_frozen(cls):
    r = make(cls)
    name, value = CHANGE[cls]
    with pytest.raises(dataclasses.FrozenInstanceError, match=f"is frozen: cannot set '{name}'.*dataclasses.replace"):
        setattr(r, name, value)
    with pytest.raises(AttributeError):
        delattr(r, name)
    changed = dataclasses.replace(r, **{name: value})
    assert getattr(changed, name) == value and getattr(r, name) != value


@pytest.mark.parametrize("cls", RECIPE_CLASSES)
def test_equal_hashable_copyable(cls):
    r, twin = make(cls), make(cls)
    assert r == twin and hash(r) == hash(twin)
    assert len({r, twin}) == 1
    assert pickle.loads(pickle.dumps(r)) == r
    assert copy.deepcopy(r) == r
    name, value = CHANGE[cls]
    assert r != dataclasses.replace(r, **{name: value})


def test_different_recipe_types_differ():
    assert MXFP8BlockScaling() != Float8BlockScaling()
    assert DelayedScaling(amax_history_len=16) != DelayedScaling()


def test_replace_recomputes_derived_fields():
    r = dataclasses.replace(Float8CurrentScaling(), use_power_2_scales=True)
    assert r.fp8_quant_fwd_inp.power_2_scale is True
    n = dataclasses.replace(NVFP4BlockScaling(), disable_rht=True)
    assert n.fp4_quant_bwd_grad.random_hadamard_transform is False
    with pytest.raises(ValueError, match="init=False"):
        dataclasses.replace(Float8CurrentScaling(), fp8_quant_fwd_inp=QParams())


def test_pickles_name_public_module():
    assert DelayedScaling.__module__ == "transformer_engine.common.recipe"
    assert b"transformer_engine.common.recipe\x94" in pickle.dumps(DelayedScaling())


# ------------------------------------------------------------------- repr ---


def test_repr_delayed_scaling():
    assert repr(DelayedScaling()) == (
        "recipe_type=DelayedScaling, margin=0, format=HYBRID, amax_history_len=1024, "
        "reduce_amax=True, fp8_dpa=False, fp8_mha=False, backward_override=None"
    )
    assert str(DelayedScaling(fp8_format=Format.E4M3)).startswith("recipe_type=DelayedScaling, margin=0, format=E4M3,")


def test_repr_other_recipes():
    assert repr(MXFP8BlockScaling()) == (
        "recipe_type=MXFP8BlockScaling, margin=0, format=E4M3, enable_2d_quantization=False, backward_override=None"
    )
    text = repr(Float8CurrentScaling())
    assert text.startswith("recipe_type=Float8CurrentScaling, format=HYBRID, fp8_quant_fwd_inp=QParams(")
    assert "fp8_gemm_fprop=MMParams(use_split_accumulator=False)" in text
    assert "x_block_scaling_dim=1, w_block_scaling_dim=2" in repr(Float8BlockScaling())
    assert repr(NVFP4BlockScaling()).startswith("recipe_type=NVFP4BlockScaling, fp4_format=E2M1, fp8_format=E4M3,")
    assert repr(CustomRecipe(qfactory)).startswith("recipe_type=CustomRecipe, qfactory=<function")


# ------------------------------------------------------------- predicates ---

PREDICATES = [
    "delayed",
    "float8_current_scaling",
    "float8_per_tensor_scaling",
    "float8_block_scaling",
    "mxfp8",
    "nvfp4",
    "custom",
]
EXPECTED = {
    DelayedScaling: {"delayed", "float8_per_tensor_scaling"},
    Float8CurrentScaling: {"float8_current_scaling", "float8_per_tensor_scaling"},
    Float8BlockScaling: {"float8_block_scaling"},
    MXFP8BlockScaling: {"mxfp8"},
    NVFP4BlockScaling: {"nvfp4"},
    CustomRecipe: {"custom"},
}


@pytest.mark.parametrize("cls", RECIPE_CLASSES)
def test_predicates(cls):
    r = make(cls)
    for name in PREDICATES:
        expected = name in EXPECTED[cls]
        assert getattr(r, name)() is expected, name  # on the instance
        assert getattr(cls, name)() is expected, name  # on the class


def test_predicates_follow_subclasses():
    @recipe._base.frozen(repr=False)
    class MyDelayed(DelayedScaling):
        pass

    assert MyDelayed().delayed() and MyDelayed.float8_per_tensor_scaling()
    assert not any(getattr(Recipe, name)() for name in PREDICATES)
    assert isinstance(DelayedScaling(), Recipe)


def test_public_names():
    from transformer_engine.common import recipe as imported

    assert imported is recipe
    for name in [
        "Format",
        "MMParams",
        "QParams",
        "Recipe",
        "DelayedScaling",
        "Float8CurrentScaling",
        "Float8BlockScaling",
        "MXFP8BlockScaling",
        "NVFP4BlockScaling",
        "CustomRecipe",
        "QuantizerRole",
    ]:
        assert name in recipe.__all__ and hasattr(recipe, name)
