"""transformer_engine: shared by the opente-core, opente-pytorch and opente-jax wheels.

Only opente-core ships this file (the framework wheels depend on it), so no two
wheels own it. extend_path makes the package span every transformer_engine
folder on sys.path, as a PEP 420 namespace would, so the framework packages
are found even when they live in another site-packages or source tree.

Like the reference, importing it does not import a framework: use
``import transformer_engine.pytorch`` or ``import transformer_engine.jax``.
"""

from pkgutil import extend_path as _extend_path

__path__ = _extend_path(__path__, __name__)

# <reference API level>.<our release>: see docs/architecture.md, "Version".
__version__ = "2.20.0.1"
