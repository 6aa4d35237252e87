"""The basic (single-tensor) operations of te.ops."""

from .activation import GEGLU, GELU, GLU, QGEGLU, QGELU, ReGLU, ReLU, SiLU, SReGLU, SReLU
from .basic_linear import BasicLinear
from .bias import Bias
from .communication import AllGather, AllReduce, ReduceScatter
from .dropout import Dropout
from .extra_tensors import AddExtraInput, MakeExtraOutput
from .grouped_linear import GroupedLinear, is_op_fuser_grouped_tensor_path_supported
from .l2normalization import L2Normalization
from .normalization import LayerNorm, RMSNorm
from .quantize import Quantize
from .scaled_activation import ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU, ScaledTanhSReLU
from .simple import ConstantScale, Identity, Reshape
from .swiglu import ClampedSwiGLU, SiTUGLU, SwiGLU

__all__ = [
    "GEGLU",
    "GELU",
    "GLU",
    "QGEGLU",
    "QGELU",
    "AddExtraInput",
    "AllGather",
    "AllReduce",
    "BasicLinear",
    "Bias",
    "ClampedSwiGLU",
    "ConstantScale",
    "Dropout",
    "GroupedLinear",
    "Identity",
    "L2Normalization",
    "LayerNorm",
    "MakeExtraOutput",
    "Quantize",
    "RMSNorm",
    "ReGLU",
    "ReLU",
    "ReduceScatter",
    "Reshape",
    "SReGLU",
    "SReLU",
    "ScaledClampedQGeGLU",
    "ScaledSReLU",
    "ScaledSiTUGLU",
    "ScaledSwiGLU",
    "ScaledTanhSReLU",
    "SiLU",
    "SiTUGLU",
    "SwiGLU",
    "is_op_fuser_grouped_tensor_path_supported",
]
