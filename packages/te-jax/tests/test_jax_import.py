"""The te-jax skeleton imports, with its flax subpackage.

(Named test_jax_import.py, not test_import.py: pytest runs every package's
tests in one session, and same-named test files in folders without
__init__.py collide.)
"""

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

pytestmark = pytest.mark.api

pytest.importorskip("jax")
# Imported only once jax is known to be there (skip, not fail, without it).
transformer_engine = importlib.import_module("transformer_engine")
te_jax = importlib.import_module("transformer_engine.jax")


def test_version_matches_distribution():
    assert te_jax.__version__ == importlib.metadata.version("opente-jax")


def test_namespace_package_is_shared():
    # Only opente-core ships transformer_engine/__init__.py (extend_path over sys.path).
    assert te_jax.__path__[0].rsplit("/", 1)[0] in transformer_engine.__path__
    assert importlib.import_module("transformer_engine.core").__version__ == transformer_engine.__version__
    recipe = importlib.import_module("transformer_engine.common.recipe")
    assert recipe.DelayedScaling().delayed()


def test_flax_subpackage():
    pytest.importorskip("flax")
    from transformer_engine.jax import flax as te_flax

    assert te_flax is sys.modules["transformer_engine.jax.flax"]
    assert te_jax.flax is te_flax
    assert te_flax.__all__ == [
        "DenseGeneral",
        "DotProductAttention",
        "LayerNorm",
        "LayerNormDenseGeneral",
        "LayerNormMLP",
        "MultiHeadAttention",
        "RelativePositionBiases",
        "TransformerEngineBase",
        "TransformerLayer",
        "TransformerLayerType",
        "extend_logical_axis_rules",
    ]
    assert all(getattr(te_flax, name) is not None for name in te_flax.__all__)


def test_attention_names_of_the_reference():
    from transformer_engine.jax import attention

    # api_coverage.md's transformer_engine.jax.attention section
    names = "AttnBiasType AttnMaskType AttnSoftmaxType QKVFormat QKVLayout CPStrategy ReorderStrategy make_swa_mask"
    names += " canonicalize_attn_mask_type is_fused_attn_kernel_available run_length_fill_flattened run_length_fill"
    names += " SequenceDescriptor fused_attn_thd fused_attn reorder_causal_load_balancing"
    names += " inverse_reorder_causal_load_balancing"
    assert all(hasattr(attention, n) for n in names.split())
    assert te_jax.attention is attention


def test_functional_op_submodules():
    # the reference's module paths: te.layernorm.layernorm, te.layernorm_dense.layernorm_dense, ...
    for module in ("activation", "layernorm", "layernorm_dense", "layernorm_mlp"):
        assert callable(getattr(getattr(te_jax, module), module))
    assert callable(te_jax.layernorm.canonicalize_norm_type)


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="has no attribute 'Linear'"):
        te_jax.Linear  # noqa: B018


def test_ops_and_quantize_load_on_first_use():
    # A fresh interpreter: this session has imported them already.
    code = (
        "import sys; import transformer_engine.jax as te_jax\n"
        "names = ('cpp_extensions', 'dense', 'quantize', 'sharding')\n"
        "loaded = lambda: [m for m in names if 'transformer_engine.jax.' + m in sys.modules]\n"
        "print(loaded())\n"
        "print(te_jax.autocast.__name__, te_jax.MeshResource.__name__, te_jax.NVTE_FP8_COLLECTION_NAME, loaded())\n"
        "print(te_jax.dense.dense.__name__, te_jax.quantize.QuantizerSet.__name__, loaded())"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    # autocast and MeshResource bring quantize and sharding, not the FFI targets (cpp_extensions)
    assert out.splitlines() == [
        "[]",
        "autocast MeshResource fp8_metas ['quantize', 'sharding']",
        "dense QuantizerSet ['cpp_extensions', 'dense', 'quantize', 'sharding']",
    ]


def test_public_names():
    from transformer_engine.jax import quantize

    for name in ("NVTE_FP8_COLLECTION_NAME", "autocast", "fp8_autocast", "update_collections", "MeshResource"):
        assert name in te_jax.__all__ and getattr(te_jax, name) is not None
    assert te_jax.autocast is quantize.autocast and te_jax.update_collections is quantize.update_collections
    assert te_jax.NVTE_FP8_COLLECTION_NAME == "fp8_metas"


def test_jaxlib_older_than_the_build_is_refused_clearly():
    registry = importlib.import_module("transformer_engine.jax.cpp_extensions._registry")
    built = importlib.import_module("transformer_engine.jax._build_info").JAXLIB_BUILT_AGAINST
    import jaxlib

    # The build's jaxlib is this one or an older one (a newer jaxlib accepts older handlers).
    assert registry._release(built) <= registry._release(jaxlib.__version__)
    registry.check_jaxlib("0.10.2", "0.10.2")
    registry.check_jaxlib("0.11.0.dev20260101", "0.10.2")
    with pytest.raises(ImportError, match=r"built against jaxlib 0\.9\.0, but jaxlib 0\.8\.3 is installed.*>= 0\.9\.0"):
        registry.check_jaxlib("0.8.3", "0.9.0")
