"""CustomRecipe (user-provided quantizers) and QuantizerRole (what a factory
is asked for)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

from .. import _env
from ._base import (
    Format,
    Recipe,
    check_backward_override,
    check_bool,
    check_format,
    check_int,
    frozen,
    refuse_type,
)


@frozen()
class QuantizerRole:
    """Identity of one quantizer slot, passed to a CustomRecipe's qfactory.

    Fields:
        module_type: the module kind, e.g. "linear", "grouped_linear", "dpa".
        tensor_type: the tensor, e.g. "input", "weight", "output", "grad_output",
                     "grad_input" (attention uses its own names, e.g. "qkv").
        name:        the module instance's name given by the caller, e.g. "fc1".

    Empty strings mean "not known". Experimental, as in the reference library.
    """

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        for attr in ("module_type", "tensor_type", "name"):
            if not isinstance(getattr(self, attr), str):
                refuse_type("QuantizerRole", attr, "a str", getattr(self, attr))


@frozen(repr=False)
class CustomRecipe(Recipe):
    """Quantizers made by a user factory (experimental).

    Fields:
        qfactory:               callable(QuantizerRole) -> a framework quantizer (or
                                a quantizer request); called when a module builds
                                its quantizers, not on every step.
        fp8_format:             read by framework code that needs one FP8 type
                                (default Format.HYBRID); the factory decides the
                                actual quantization.
        fp8_dpa, fp8_mha:       FP8 attention (beta).
        backward_override:      None, "high_precision" or "dequantized"; default
                                from NVTE_BACKWARD_OVERRIDE.
        quantization_alignment: padding multiple for grouped inputs (default 128).
    """

    _kind = "custom"

    qfactory: Callable[..., Any]
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: str | None = field(default_factory=_env.backward_override)
    quantization_alignment: int = 128

    def __post_init__(self) -> None:
        if not callable(self.qfactory):
            refuse_type("CustomRecipe", "qfactory", "a callable(QuantizerRole) -> quantizer", self.qfactory)
        check_format(self, "fp8_format")
        for name in ("fp8_dpa", "fp8_mha"):
            check_bool(self, name)
        check_backward_override(self)
        check_int(self, "quantization_alignment", minimum=1)

    def _repr_fields(self) -> tuple:
        return (
            ("qfactory", self.qfactory),
            ("quantization_alignment", self.quantization_alignment),
            ("backward_override", self.backward_override),
        )
