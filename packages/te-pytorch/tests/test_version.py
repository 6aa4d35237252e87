"""The version scheme and the identity that integrating libraries read.

Scheme (docs/architecture.md, "Version"): <reference API level>.<our release>,
e.g. 2.20.0.1 = the reference's 2.20.0 API, our first release of it. Every
wheel and the C library carry the same string. Lightning gates
precision="transformer-engine" on importlib.metadata.version("transformer_engine")
>= 0.11.0, Accelerate on importlib.metadata.metadata("transformer-engine"),
Megatron-Core reads transformer_engine.__version__ (else the metadata) and
branches on it; all must see a TE 2.x that is not a pre-release.
"""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import re

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import transformer_engine
import transformer_engine.core as core
import transformer_engine.pytorch as te

# Written out here, not read from the code under test.
API_LEVEL = (2, 20, 0)
ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_every_answer_is_the_same_version():
    answers = {
        "transformer_engine.__version__": transformer_engine.__version__,
        "transformer_engine.pytorch.__version__": te.__version__,
        "transformer_engine.core.__version__ (te_version())": core.__version__,
        'metadata "transformer_engine"': md.version("transformer_engine"),
        'metadata "transformer-engine"': md.version("transformer-engine"),
        'metadata "opente-core"': md.version("opente-core"),
    }
    assert len(set(answers.values())) == 1, answers


def test_scheme_states_the_reference_api_level():
    version = Version(transformer_engine.__version__)
    assert version.release[:3] == API_LEVEL and len(version.release) == 4 and version.release[3] >= 1
    assert not version.is_prerelease and not version.is_devrelease and version.local is None


def test_integrating_libraries_accept_it():
    version = Version(md.version("transformer_engine"))
    assert SpecifierSet(">=0.11.0").contains(version)  # Lightning's gate
    assert version >= Version("2.0.0")  # Megatron-Core's TE 2.x code path
    assert md.metadata("transformer-engine")["Name"] == "transformer_engine"  # Accelerate's check


def test_repository_files_agree():
    # (Runs where the tests run from the checkout; the wheels' own versions
    # are compared above.)
    if not (ROOT / "packages" / "opente" / "pyproject.toml").exists():
        pytest.skip("not run from the repository checkout")
    version = transformer_engine.__version__
    found = {}
    for name in ("te-core", "te-pytorch", "te-jax", "opente"):
        text = (ROOT / "packages" / name / "pyproject.toml").read_text()
        found[name] = re.findall(r'(?m)^version = "([^"]+)"', text) + re.findall(r"opente-[a-z]+==([0-9.]+)", text)
    found["core/CMakeLists.txt"] = re.findall(
        r"project\(te_core VERSION ([0-9.]+)", (ROOT / "core/CMakeLists.txt").read_text()
    )
    found["te-jax __init__"] = re.findall(
        r'__version__ = "([^"]+)"', (ROOT / "packages/te-jax/python/transformer_engine/jax/__init__.py").read_text()
    )
    assert all(v == [version] * len(v) and v for k, v in found.items() if k != "te-pytorch"), found
    assert found["te-pytorch"] == [version]  # its version is dynamic (from __init__.py); the core pin is checked
