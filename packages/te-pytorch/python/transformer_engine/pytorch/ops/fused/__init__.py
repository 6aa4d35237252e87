"""Fused operations of te.ops, registered with the fuser at import.

Forward: ForwardLinearBiasActivation (BasicLinear + Bias in one GEMM).
Backward: BackwardActivationBias (Bias + activation in one kernel pass).
"""

from ..fuser import register_backward_fusion, register_forward_fusion
from .backward_activation_bias import BackwardActivationBias
from .forward_linear_bias import ForwardLinearBiasActivation

register_forward_fusion(ForwardLinearBiasActivation.fuse_forward_ops)
register_backward_fusion(BackwardActivationBias.fuse_backward_ops)

__all__ = ["BackwardActivationBias", "ForwardLinearBiasActivation"]
