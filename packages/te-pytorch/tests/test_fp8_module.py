"""transformer_engine.pytorch.fp8 (the reference's deprecated module) and the
availability functions: return shapes, the native-support rule of each format
(written out here per compute capability, from the reference's rules), and
reasons that say when a format runs emulated."""

from __future__ import annotations

import importlib

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.core import DType
from transformer_engine.pytorch import device

pytest_plugins = ["pt_fixtures"]


def _fp8_module():
    with pytest.warns(DeprecationWarning, match="transformer_engine.pytorch.fp8 is deprecated"):
        return importlib.reload(importlib.import_module("transformer_engine.pytorch.fp8"))


def test_deprecated_module_reexports():
    fp8 = _fp8_module()
    assert fp8.FP8GlobalStateManager is te.FP8GlobalStateManager
    assert fp8.fp8_autocast is te.fp8_autocast and fp8.fp8_model_init is te.fp8_model_init
    assert fp8.autocast is te.autocast and fp8.quantized_model_init is te.quantized_model_init
    assert type(fp8.get_default_fp8_recipe()) is type(te.get_default_recipe())
    for name in fp8.__all__:
        assert hasattr(fp8, name), name


def test_fp8_dtypes_and_maxima():
    fp8 = _fp8_module()
    hybrid = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID)
    e4m3 = recipe.DelayedScaling(fp8_format=recipe.Format.E4M3)
    assert fp8.get_fp8_te_dtype(hybrid, True) is DType.kFloat8E4M3
    assert fp8.get_fp8_te_dtype(hybrid, fprop_tensor=False) is DType.kFloat8E5M2
    assert fp8.get_fp8_te_dtype(e4m3, False) is DType.kFloat8E4M3
    assert (fp8.get_fp8_max(hybrid), fp8.get_fp8_max(hybrid, False), fp8.get_fp8_max(e4m3, False)) == (
        448.0,
        57344.0,
        448.0,
    )
    assert fp8.get_fp4_te_dtype(recipe.NVFP4BlockScaling()) is DType.kFloat4E2M1
    with pytest.raises(ValueError, match="needs an NVFP4BlockScaling recipe, got DelayedScaling"):
        fp8.get_fp4_te_dtype(hybrid)


CHECKS = {
    "FP8": ("check_fp8_support", te.is_fp8_available, "is_fp8_available"),
    "MXFP8": ("check_mxfp8_support", te.is_mxfp8_available, "is_mxfp8_available"),
    "FP8 block scaling": (
        "check_fp8_block_scaling_support",
        te.is_fp8_block_scaling_available,
        "is_fp8_block_scaling_available",
    ),
    "NVFP4": ("check_nvfp4_support", te.is_nvfp4_available, "is_nvfp4_available"),
}


@pytest.mark.parametrize("what", list(CHECKS))
def test_shapes_agree_and_the_cpu_says_emulated(what, monkeypatch):
    check_name, is_available, manager_name = CHECKS[what]
    fp8 = _fp8_module()
    monkeypatch.setattr(device.torch.cuda, "is_available", lambda: False)
    answer = getattr(fp8, check_name)()
    assert isinstance(answer, tuple) and answer[0] is False and isinstance(answer[1], str)
    assert f"{what} runs emulated on the CPU" in answer[1]
    assert is_available() is False and is_available(return_reason=True) == answer
    assert getattr(te.FP8GlobalStateManager, manager_name)() == answer


@pytest.fixture
def fake_gpu(monkeypatch):
    def make(capability, cuda_version="12.9", core_cuda=True):
        monkeypatch.setattr(device.torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(device, "get_device_compute_capability", lambda: capability)
        monkeypatch.setattr(device.torch.version, "cuda", cuda_version)
        monkeypatch.setattr(device.core, "built_with_cuda", lambda: core_cuda)

    return make


# (capability, CUDA version) -> native? per format: the reference's rules.
NATIVE = {
    "MXFP8": {((9, 0), "12.9"): False, ((10, 0), "12.9"): True, ((10, 3), "13.0"): True, ((12, 0), "12.9"): False},
    "FP8 block scaling": {((9, 0), "12.9"): True, ((9, 0), "12.8"): False, ((8, 9), "12.9"): False},
    "NVFP4": {((9, 0), "12.9"): False, ((10, 0), "12.9"): True, ((8, 9), "12.9"): False},
}


@pytest.mark.parametrize("what", list(NATIVE))
def test_block_formats_native_rule_and_emulated_reason(what, fake_gpu):
    _, is_available, _ = CHECKS[what]
    for (capability, cuda), native in NATIVE[what].items():
        fake_gpu(capability, cuda)
        ok, reason = is_available(return_reason=True)
        assert ok is native, (capability, cuda)
        if native:
            assert reason == ""
        else:
            assert f"{capability[0]}.{capability[1]}, where te runs {what} emulated" in reason
    fake_gpu((10, 0), core_cuda=False)
    ok, reason = is_available(return_reason=True)
    assert not ok and "TE_WITH_CUDA=OFF" in reason and "emulated on the CPU" in reason


def test_bf16(fake_gpu, monkeypatch):
    fake_gpu((7, 5))
    ok, reason = te.is_bf16_available(return_reason=True)
    assert not ok and "8.0" in reason and "7.5" in reason
    fake_gpu((8, 0))
    assert te.is_bf16_available() is True and te.is_bf16_available(return_reason=True) == (True, "")
    monkeypatch.setattr(device.torch.cuda, "is_available", lambda: False)
    assert te.is_bf16_available() is True


@pytest.mark.parametrize("encoded, expected", [(90100, (9, 1, 0)), (91002, (9, 10, 2)), (8902, (8, 9, 2))])
def test_get_cudnn_version(monkeypatch, encoded, expected):
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: encoded)
    assert te.get_cudnn_version() == expected


def test_get_cudnn_version_without_cudnn(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no cuDNN"):
        te.get_cudnn_version()
