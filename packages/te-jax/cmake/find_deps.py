"""Prints, one per line, what the te-jax build needs from installed packages:
jaxlib's XLA FFI include dir, te-core's C include dir, te-core's library and
the jaxlib version the handlers are compiled against."""

import os
import sys

try:
    import jax.ffi
except ImportError:
    sys.exit("te-jax: jax is not installed in the build's Python (build with --no-build-isolation)")
try:
    import transformer_engine.core as core
except ImportError:
    sys.exit("te-jax: te-core is not installed in the build's Python (build with --no-build-isolation)")

core_dir = os.path.dirname(core.__file__)
print(jax.ffi.include_dir())
print(os.path.join(core_dir, "include"))
print(os.path.join(core_dir, "libte_core.so"))
import jaxlib  # noqa: E402 - (present whenever jax.ffi imported)

print(jaxlib.__version__)
