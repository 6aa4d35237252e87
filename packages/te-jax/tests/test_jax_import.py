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

pytest.importorskip("jax")
# Imported only once jax is known to be there (skip, not fail, without it).
transformer_engine = importlib.import_module("transformer_engine")
te_jax = importlib.import_module("transformer_engine.jax")


def test_version_matches_distribution():
    assert te_jax.__version__ == importlib.metadata.version("te-jax")


def test_namespace_package_is_shared():
    assert getattr(transformer_engine, "__file__", None) is None
    assert importlib.import_module("transformer_engine.core").__version__ == "0.1.0"
    recipe = importlib.import_module("transformer_engine.common.recipe")
    assert recipe.DelayedScaling().delayed()


def test_flax_subpackage():
    pytest.importorskip("flax")
    from transformer_engine.jax import flax as te_flax

    assert te_flax is sys.modules["transformer_engine.jax.flax"]
    assert te_jax.flax is te_flax
    assert te_flax.__all__ == []


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="has no attribute 'Linear'"):
        te_jax.Linear  # noqa: B018


def test_ops_and_quantize_load_on_first_use():
    # A fresh interpreter: this session has imported them already.
    code = (
        "import sys; import transformer_engine.jax as te_jax\n"
        "lazy = [m for m in ('cpp_extensions', 'dense', 'quantize') if 'transformer_engine.jax.' + m in sys.modules]\n"
        "print(lazy, te_jax.dense.dense.__name__, te_jax.quantize.QuantizerSet.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["[]", "dense", "QuantizerSet"]
