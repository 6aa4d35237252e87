"""Sphinx configuration of the documentation site (`nox -s docs` builds it into build/docs/html).

The pages are the Markdown files of this folder, read as they are by myst-parser; the API
reference is autodoc over the installed packages (te-core, te-pytorch, te-jax), so the
build imports them: run it in an environment where they are installed (noxfile.py, docs).
"""

from __future__ import annotations

import sys

import transformer_engine

project = "Transformer Engine (open re-implementation)"
author = "the opente authors"
copyright = "the opente authors"
release = version = transformer_engine.__version__

extensions = [
    "myst_parser",  # the Markdown pages
    "sphinx.ext.autodoc",  # the API reference, from the docstrings
    "sphinx.ext.napoleon",  # Google/NumPy-style "Args:" / "Parameters" sections in them
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Every warning is an error (-W in noxfile.py), and nitpicky mode reports every cross-reference
# that does not resolve: a broken internal link, page or heading anchor fails the build.
nitpicky = True
# Types of other projects: we do not fetch their inventories (intersphinx needs the network,
# which CI does not have), so their names in signatures stay plain text instead of links.
nitpick_ignore_regex = [
    ("py:.*", r"(torch|numpy|np|jax|jnp|flax|nn|ml_dtypes|optax)(\..*)?"),
    ("py:.*", r"(enum|collections|typing|contextlib|dataclasses|abc)\..*"),  # the standard library's
]

# Markdown: GitHub-style anchors for headings down to level 4, so that the links of the
# existing pages (numerics.md#normalization-normh) resolve, and are checked, as on GitHub.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
# A method without a docstring of its own (forward, mostly) is left out rather than shown with
# torch.nn.Module's text.
autodoc_inherit_docstrings = False  # show `recipe=None`, not the evaluated default objects
napoleon_google_docstring = True
napoleon_numpy_docstring = True
# The recipes list their dataclass fields (and Format its members) under these headings.
napoleon_custom_sections = [("Fields", "params_style"), ("Members", "params_style")]

html_theme = "alabaster"
html_title = f"{project} {release}"
html_theme_options = {"description": "FP8 / MXFP8 / NVFP4 training for PyTorch and JAX", "fixed_sidebar": True}
html_show_sourcelink = False


# The modules whose __all__ is the public API; a class is documented under one of them.
PUBLIC_MODULES = (
    "transformer_engine.common.recipe",
    "transformer_engine.core",
    "transformer_engine.pytorch",
    "transformer_engine.pytorch.ops",
    "transformer_engine.jax.quantize",
    "transformer_engine.jax.flax",
)


def public_bases(app, name, obj, options, bases) -> None:
    """Names a base class of ours by its public path (te.QuantizedTensor, not the module that
    defines it), so that "Bases:" links to its entry; an internal base is named, unlinked."""
    for i, base in enumerate(bases):
        if not getattr(base, "__module__", "").startswith("transformer_engine."):
            continue
        for public in PUBLIC_MODULES:
            module = sys.modules.get(public)
            if base.__name__ in getattr(module, "__all__", ()) and getattr(module, base.__name__) is base:
                bases[i] = f":py:class:`{public}.{base.__name__}`"
                break
        else:
            bases[i] = f"``{base.__qualname__}``"


def setup(app) -> None:
    app.connect("autodoc-process-bases", public_bases)
