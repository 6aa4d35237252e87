"""Deprecated name of transformer_engine.core.reference_norm (the oracles are
reference_<family>.py); kept for one release."""

import warnings

from .reference_norm import *  # noqa: F403

warnings.warn(
    "transformer_engine.core.norm_reference is renamed transformer_engine.core.reference_norm",
    DeprecationWarning,
    stacklevel=2,
)
