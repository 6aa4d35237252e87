"""te-pytorch imports, exports its API and answers FP8 availability honestly.

(Named test_pytorch_import.py, not test_import.py: pytest runs every package's
tests in one session, and same-named test files in folders without
__init__.py collide.)
"""

import importlib
import importlib.metadata

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.api
# Imported only once torch is known to be there (a plain import would fail
# collection on machines without torch instead of skipping).
transformer_engine = importlib.import_module("transformer_engine")
te = importlib.import_module("transformer_engine.pytorch")
device = importlib.import_module("transformer_engine.pytorch.device")
recipe = importlib.import_module("transformer_engine.common.recipe")


def test_version_matches_distribution():
    try:
        installed = importlib.metadata.version("opente-pytorch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("opente-pytorch is used from the source tree (PYTHONPATH), not installed")
    assert te.__version__ == installed


def test_namespace_package_is_shared():
    # Only opente-core ships transformer_engine/__init__.py; it extends the
    # package over every transformer_engine folder on sys.path.
    assert transformer_engine.__file__.endswith("__init__.py")
    pytorch_dir = te.__path__[0].rsplit("/", 1)[0]
    assert pytorch_dir in transformer_engine.__path__
    assert importlib.import_module("transformer_engine.core").__version__ == transformer_engine.__version__
    assert importlib.import_module("transformer_engine.common.recipe") is recipe


def test_reexports():
    assert te.QuantizerRole is recipe.QuantizerRole
    assert te.DType is importlib.import_module("transformer_engine.core").DType
    for name in (
        "Linear",
        "LayerNorm",
        "RMSNorm",
        "autocast",
        "fp8_autocast",
        "Float8Tensor",
        "Float8Quantizer",
        "Float8CurrentScalingQuantizer",
        "DType",
        "QuantizerRole",
        "get_device_compute_capability",
        "is_fp8_available",
        "get_default_recipe",
        "ops",
    ):
        assert name in te.__all__ and hasattr(te, name)


def test_is_fp8_available_shape():
    available = te.is_fp8_available()
    assert isinstance(available, bool)
    answer, reason = te.is_fp8_available(return_reason=True)
    assert answer is available and isinstance(reason, str)
    assert (reason == "") == available


@pytest.fixture
def fake_device(monkeypatch):
    """Pretends a CUDA device of the given capability and a core build."""

    def make(capability, core_cuda=True, cuda_version="12.8"):
        monkeypatch.setattr(device.torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(device, "get_device_compute_capability", lambda: capability)
        monkeypatch.setattr(device.torch.version, "cuda", cuda_version)
        monkeypatch.setattr(device.core, "built_with_cuda", lambda: core_cuda)

    return make


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (12, 0)])
def test_fp8_available_on_capable_devices(fake_device, capability):
    fake_device(capability)
    assert te.is_fp8_available(return_reason=True) == (True, "")


def test_fp8_unavailable_reasons(fake_device, monkeypatch):
    fake_device((8, 0))
    ok, reason = te.is_fp8_available(return_reason=True)
    assert not ok and "compute capability 8.9" in reason and "8.0" in reason
    fake_device((8, 9), cuda_version="11.8")
    ok, reason = te.is_fp8_available(return_reason=True)
    assert not ok and "CUDA 12.1" in reason
    fake_device((9, 0), core_cuda=False)
    ok, reason = te.is_fp8_available(return_reason=True)
    assert not ok and "TE_WITH_CUDA=OFF" in reason
    monkeypatch.setattr(device.torch.cuda, "is_available", lambda: False)
    ok, reason = te.is_fp8_available(return_reason=True)
    assert not ok and "no CUDA device" in reason and "CPU" in reason
