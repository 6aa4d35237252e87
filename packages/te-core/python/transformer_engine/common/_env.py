"""The environment variables read by te-core's Python packages, in one place.

Every variable is read when the value is needed (a recipe reads its defaults
when it is constructed, not when this module is imported), so setting one in
a running process affects the recipes built afterwards. docs/envvars.md
documents each of them; ``ENV_VARS`` below is the list that document follows.

Flags follow the reference library: a flag is on only when its value is
exactly "1". An empty string counts as unset.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class EnvVar(NamedTuple):
    name: str
    default: str
    meaning: str


ENV_VARS = (
    EnvVar(
        "NVTE_BACKWARD_OVERRIDE",
        "(unset)",
        "default backward_override of every recipe: 'high_precision' or 'dequantized'",
    ),
    EnvVar("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "0", "Float8CurrentScaling.use_power_2_scales default"),
    EnvVar(
        "NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
        "0",
        "Float8BlockScaling.use_f32_scales default (1 = scales not rounded to powers of 2)",
    ),
    EnvVar("NVTE_NVFP4_DISABLE_RHT", "0", "NVFP4BlockScaling.disable_rht default"),
    EnvVar("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING", "0", "NVFP4BlockScaling.disable_stochastic_rounding default"),
    EnvVar("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "0", "NVFP4BlockScaling.disable_2d_quantization default"),
    EnvVar("NVTE_NVFP4_ROW_SCALED_ACTIVATION", "0", "NVFP4BlockScaling.row_scaled_activation default"),
    EnvVar("NVTE_NVFP4_4OVER6", "none", "NVFP4BlockScaling.nvfp4_4over6 default"),
    EnvVar("NVTE_NVFP4_4OVER6_E4M3_USE_256", "all", "NVFP4BlockScaling.nvfp4_4over6_e4m3_use_256 default"),
    EnvVar("NVTE_NVFP4_4OVER6_ERR_MODE", "MAE", "NVFP4BlockScaling.nvfp4_4over6_err_mode default (upper-cased)"),
)


def _value(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


def _flag(name: str) -> bool:
    return _value(name) == "1"


def backward_override() -> str | None:
    return _value("NVTE_BACKWARD_OVERRIDE")


def fp8_current_scaling_power_2_scales() -> bool:
    return _flag("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES")


def fp8_block_scaling_fp32_scales() -> bool:
    return _flag("NVTE_FP8_BLOCK_SCALING_FP32_SCALES")


def nvfp4_disable_rht() -> bool:
    return _flag("NVTE_NVFP4_DISABLE_RHT")


def nvfp4_disable_stochastic_rounding() -> bool:
    return _flag("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING")


def nvfp4_disable_2d_quantization() -> bool:
    return _flag("NVTE_NVFP4_DISABLE_2D_QUANTIZATION")


def nvfp4_row_scaled_activation() -> bool:
    return _flag("NVTE_NVFP4_ROW_SCALED_ACTIVATION")


def nvfp4_4over6() -> str:
    return _value("NVTE_NVFP4_4OVER6") or "none"


def nvfp4_4over6_e4m3_use_256() -> str:
    return _value("NVTE_NVFP4_4OVER6_E4M3_USE_256") or "all"


def nvfp4_4over6_err_mode() -> str:
    return (_value("NVTE_NVFP4_4OVER6_ERR_MODE") or "MAE").upper()
