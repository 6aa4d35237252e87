"""Strict constructor arguments: every module rejects a bad size, flag, eps or
params_dtype at construction, with an error naming the argument and the rule."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import transformer_engine.pytorch as te

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.module, pytest.mark.usefixtures("te_state")]

# name -> a constructor taking the keyword arguments to override.
MODULES = {
    "Linear": lambda **kw: te.Linear(**{"in_features": 8, "out_features": 16, "device": "cpu", **kw}),
    "LayerNormLinear": lambda **kw: te.LayerNormLinear(**{"in_features": 8, "out_features": 16, "device": "cpu", **kw}),
    "LayerNormMLP": lambda **kw: te.LayerNormMLP(**{"hidden_size": 8, "ffn_hidden_size": 16, "device": "cpu", **kw}),
    "LayerNorm": lambda **kw: te.LayerNorm(**{"normalized_shape": 8, "device": "cpu", **kw}),
    "RMSNorm": lambda **kw: te.RMSNorm(**{"normalized_shape": 8, "device": "cpu", **kw}),
}
SIZES = {
    "Linear": ("in_features", "out_features"),
    "LayerNormLinear": ("in_features", "out_features"),
    "LayerNormMLP": ("hidden_size", "ffn_hidden_size"),
}
HAS_BIAS_ARG = ("Linear", "LayerNormLinear", "LayerNormMLP")
HAS_EPS = ("LayerNormLinear", "LayerNormMLP", "LayerNorm", "RMSNorm")
DTYPE_ARG = {"LayerNorm": "dtype", "RMSNorm": "dtype"}


@pytest.mark.parametrize("module", list(SIZES))
@pytest.mark.parametrize(
    ("value", "error"), [(True, TypeError), ("8", TypeError), (8.0, TypeError), (0, ValueError), (-4, ValueError)]
)
def test_sizes_must_be_positive_ints(module, value, error):
    for name in SIZES[module]:
        with pytest.raises(error, match=rf"{name} must be an int > 0"):
            MODULES[module](**{name: value})


@pytest.mark.parametrize("module", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("value", ["8", True, 8.0, ("8",), (8, False), ()])
def test_normalized_shape_must_be_positive_ints(module, value):
    with pytest.raises(TypeError, match="normalized_shape"):
        MODULES[module](normalized_shape=value)


@pytest.mark.parametrize("module", ["LayerNorm", "RMSNorm"])
def test_normalized_shape_rejects_non_positive_dims(module):
    with pytest.raises(ValueError, match=r"normalized_shape\[1\] must be an int > 0"):
        MODULES[module](normalized_shape=(4, 0))


@pytest.mark.parametrize("module", HAS_BIAS_ARG)
@pytest.mark.parametrize("value", ["yes", "False", 1, None])
def test_bias_must_be_bool(module, value):
    with pytest.raises(TypeError, match="bias must be a bool"):
        MODULES[module](bias=value)


@pytest.mark.parametrize("module", HAS_EPS)
@pytest.mark.parametrize("value", ["False", 1])
def test_zero_centered_gamma_must_be_bool(module, value):
    with pytest.raises(TypeError, match="zero_centered_gamma must be a bool"):
        MODULES[module](zero_centered_gamma=value)


@pytest.mark.parametrize("module", HAS_EPS)
@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("1e-5", TypeError),
        (True, TypeError),
        (None, TypeError),
        (-1e-5, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
    ],
)
def test_eps_must_be_a_finite_non_negative_number(module, value, error):
    with pytest.raises(error, match="eps must be a"):
        MODULES[module](eps=value)


@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2, torch.int32, "float32"]
)
def test_params_dtype_must_be_a_supported_float(module, dtype):
    name = DTYPE_ARG.get(module, "params_dtype")
    with pytest.raises(TypeError, match=rf"{name} must be one of torch.float32, torch.float16, torch.bfloat16"):
        MODULES[module](**{name: dtype})


@pytest.mark.parametrize("module", ["LayerNorm", "RMSNorm"])
def test_norm_deprecated_params_dtype_is_named(module):
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="params_dtype must be one of"):
        MODULES[module](params_dtype=torch.float64)


@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_good_arguments_still_build(module, dtype):
    name = DTYPE_ARG.get(module, "params_dtype")
    layer = MODULES[module](**{name: dtype})
    assert all(p.dtype == dtype for p in layer.parameters())


def test_numpy_ints_and_eps_are_accepted():
    np = pytest.importorskip("numpy")
    layer = te.LayerNormLinear(np.int64(8), np.int32(4), eps=np.float32(1e-6), device="cpu")
    assert (layer.in_features, layer.out_features) == (8, 4) and layer.eps == pytest.approx(1e-6)
    assert te.LayerNorm(torch.Size([2, 4]), device="cpu").normalized_shape == (2, 4)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: te.DotProductAttention(True, 8), "num_attention_heads"),
        (lambda: te.DotProductAttention(4, "8"), "kv_channels"),
        (lambda: te.DotProductAttention(4, (8, 0)), r"kv_channels\[1\]"),
        (lambda: te.DotProductAttention(4, 8, num_gqa_groups=2.0), "num_gqa_groups"),
        (lambda: te.MultiheadAttention(32.0, 4, device="cpu"), "hidden_size"),
        (lambda: te.MultiheadAttention(32, 0, device="cpu"), "num_attention_heads"),
        (lambda: te.MultiheadAttention(32, 4, kv_channels=False, device="cpu"), "kv_channels"),
    ],
)
def test_attention_sizes_must_be_positive_ints(build, name):
    with pytest.raises((TypeError, ValueError), match=rf"{name} must be an int > 0"):
        build()


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"params_dtype": torch.float64}, "params_dtype must be one of"),
        ({"layernorm_epsilon": "1e-5"}, "eps must be a real number"),
        ({"bias": "yes"}, "bias must be a bool"),
    ],
)
def test_multihead_attention_arguments(kwargs, rule):
    with pytest.raises(TypeError, match=rule):
        te.MultiheadAttention(32, 4, device="cpu", **kwargs)


# ------------------------------------------------------------------ device: one rule for every form

# Every public module with a device argument, built with the given device (MHA and TransformerLayer too).
DEVICE_MODULES = {
    **MODULES,
    "MultiheadAttention": lambda **kw: te.MultiheadAttention(**{"hidden_size": 16, "num_attention_heads": 2, **kw}),
    "TransformerLayer": lambda **kw: te.TransformerLayer(
        **{"hidden_size": 16, "ffn_hidden_size": 32, "num_attention_heads": 2, **kw}
    ),
}
CUDA_FORMS = ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0)]


@pytest.mark.parametrize("module", list(DEVICE_MODULES))
@pytest.mark.parametrize("device", CUDA_FORMS, ids=repr)
def test_explicit_cuda_device_without_cuda_is_an_error_in_every_form(module, device):
    """ "cuda" and torch.device("cuda:0") behave the same: without CUDA, the
    error names the module and the argument (no silent CPU fallback)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: an explicit CUDA device is used")
    with pytest.raises(RuntimeError, match=r"te\.\w+|LayerNorm|RMSNorm") as info:
        DEVICE_MODULES[module](device=device)
    assert f"device={device!r} asks for CUDA, but no CUDA device is available" in str(info.value)


@pytest.mark.parametrize("module", list(DEVICE_MODULES))
def test_default_device_without_cuda_is_the_cpu(module):
    """Left at its default, the device is CUDA when available, else the CPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the one-time CPU fallback warning)
        layer = DEVICE_MODULES[module]() if module not in MODULES else _build_default(module)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert {p.device.type for p in layer.parameters()} == {expected}


def _build_default(module):
    """MODULES[module] without its device="cpu"."""
    args = {
        "Linear": (8, 16),
        "LayerNormLinear": (8, 16),
        "LayerNormMLP": (8, 16),
        "LayerNorm": (8,),
        "RMSNorm": (8,),
    }[module]
    return getattr(te, module)(*args)


@pytest.mark.parametrize("module", ["Linear", "LayerNormMLP", "MultiheadAttention"])
@pytest.mark.parametrize(
    ("device", "error", "rule"),
    [("gpu", ValueError, "is not a valid torch device"), (0, TypeError, "device must be a str or torch.device")],
)
def test_bad_device_values_are_named(module, device, error, rule):
    with pytest.raises(error, match=rule):
        DEVICE_MODULES[module](device=device)


def test_signature_default_is_still_the_references_cuda():
    import inspect

    for cls in (te.Linear, te.LayerNormLinear, te.LayerNormMLP, te.MultiheadAttention, te.TransformerLayer):
        default = inspect.signature(cls).parameters["device"].default
        assert default == "cuda" and isinstance(default, str), cls


# ------------------------------------------------------------------ forward input: a torch.Tensor

FORWARD_MODULES = ["Linear", "LayerNormLinear", "LayerNormMLP", "LayerNorm", "RMSNorm"]


@pytest.mark.parametrize("module", FORWARD_MODULES)
@pytest.mark.parametrize(
    ("value", "hint"),
    [(None, "NoneType"), (np.ones((4, 8), np.float32), r"ndarray \(convert it with torch.from_numpy")],
)
def test_forward_input_must_be_a_tensor(module, value, hint):
    layer = MODULES[module]()
    with pytest.raises(TypeError, match=rf"inp must be a torch\.Tensor, got {hint}"):
        layer(value)
