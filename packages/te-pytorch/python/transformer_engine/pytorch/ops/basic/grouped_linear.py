"""GroupedLinear (te.ops): not yet supported; te.GroupedLinear (the module) is."""

from __future__ import annotations

from ..op import BasicOperation


def is_op_fuser_grouped_tensor_path_supported() -> bool:
    """Whether the op fuser's grouped-tensor path is available: not in this implementation."""
    return False


class GroupedLinear(BasicOperation):
    """Several linear transformations over splits of the input: not yet
    supported in te.ops (use te.GroupedLinear, the module)."""

    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError(
            "te.ops.GroupedLinear is not yet supported by transformer_engine.pytorch.ops; use "
            "transformer_engine.pytorch.GroupedLinear (the module) meanwhile"
        )

    def op_forward(self, *args, **kwargs):  # pragma: no cover - never constructed
        raise NotImplementedError

    def op_backward(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError
