"""transformer_engine.pytorch.ops: fusible operations (the reference's te.ops API)::

    import transformer_engine.pytorch as te

    model = te.ops.Sequential(
        te.ops.LayerNorm(1024),
        te.ops.Linear(1024, 4096),
        te.ops.GELU(),
        te.ops.Linear(4096, 1024),
    )
    with te.autocast(recipe=recipe.MXFP8BlockScaling()):
        y = model(x)

Each basic op (BasicLinear, Bias, the norms, the activations, ...) owns its
parameters and quantization state; Sequential runs each run of adjacent ops
in one OperationFuser, which may replace groups of them with fused ops
(register_forward_fusion / register_backward_fusion /
register_forward_backward_fusion). The numerics are te-pytorch's: the same
kernels, quantizers and recipe states as te.Linear and te.LayerNormMLP.
"""

from . import fused
from .basic import *  # noqa: F403 - the reference exports every basic op at this level
from .basic import __all__ as _basic_names
from .fuser import register_backward_fusion, register_forward_backward_fusion, register_forward_fusion
from .linear import Linear
from .op import BasicOperation, FusedOperation, FusibleOperation
from .sequential import Sequential

__all__ = [
    *_basic_names,
    "BasicOperation",
    "FusedOperation",
    "FusibleOperation",
    "Linear",
    "Sequential",
    "fused",
    "register_backward_fusion",
    "register_forward_backward_fusion",
    "register_forward_fusion",
]
