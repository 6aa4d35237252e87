"""te.Fp8Padding / te.Fp8Unpadding: pad each row block of a grouped input to the
recipe's alignment (and take the padding off again), so that every GEMM of a
GroupedLinear sees a row count its quantized format accepts.

Alignment (align_size None): 16 rows, 32 under MXFP8BlockScaling, 128 under
NVFP4BlockScaling, the recipe's quantization_alignment for CustomRecipe (the
reference's rules), read from the autocast recipe at the call. Padding rows
are zeros; gradients flow through (the padding's are dropped).
"""

from __future__ import annotations

import torch

from ..quantization import FP8GlobalStateManager


def _alignment(align_size) -> int:
    if align_size is not None:
        return align_size
    recipe = FP8GlobalStateManager.get_fp8_recipe()
    if getattr(recipe, "quantization_alignment", None) is not None:
        return int(recipe.quantization_alignment)
    if recipe.nvfp4():
        return 128
    if recipe.mxfp8():
        return 32
    return 16


def _check(owner, num_gemms, inp, m_splits):
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"{owner}: argument 'inp' must be a torch.Tensor, got {type(inp).__name__}")
    m_splits = [int(m) for m in (m_splits.tolist() if isinstance(m_splits, torch.Tensor) else m_splits)]
    if len(m_splits) != num_gemms or min(m_splits, default=0) < 0:
        raise ValueError(f"{owner}: m_splits must be {num_gemms} non-negative ints, got {m_splits!r}")
    return m_splits


def _check_align(owner, align_size):
    if align_size is not None and (isinstance(align_size, bool) or not isinstance(align_size, int) or align_size < 1):
        raise ValueError(f"{owner}: align_size must be None or a positive int, got {align_size!r}")


class Fp8Padding(torch.nn.Module):
    """forward(inp [rows, ...], m_splits) -> (padded inp, padded m_splits)."""

    def __init__(self, num_gemms: int, align_size=None) -> None:
        super().__init__()
        _check_align("te.Fp8Padding", align_size)
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp, m_splits):
        m_splits = _check("te.Fp8Padding", self.num_gemms, inp, m_splits)
        if sum(m_splits) != inp.shape[0]:
            raise ValueError(f"te.Fp8Padding: m_splits sum to {sum(m_splits)}, inp has {inp.shape[0]} rows")
        align = _alignment(self.align_size)
        padded = [(m + align - 1) // align * align for m in m_splits]
        if padded == m_splits:
            return inp, m_splits
        pieces = []
        for piece, m, p in zip(inp.split(m_splits), m_splits, padded):
            pieces.append(piece)
            if p > m:
                pieces.append(inp.new_zeros((p - m, *inp.shape[1:])))
        return torch.cat(pieces), padded


class Fp8Unpadding(torch.nn.Module):
    """forward(inp [padded rows, ...], m_splits (the unpadded sizes)) -> inp without the padding rows."""

    def __init__(self, num_gemms: int, align_size=None) -> None:
        super().__init__()
        _check_align("te.Fp8Unpadding", align_size)
        self.num_gemms = num_gemms
        self.align_size = align_size

    def forward(self, inp, m_splits):
        m_splits = _check("te.Fp8Unpadding", self.num_gemms, inp, m_splits)
        align = _alignment(self.align_size)
        padded = [(m + align - 1) // align * align for m in m_splits]
        if sum(padded) != inp.shape[0]:
            raise ValueError(
                f"te.Fp8Unpadding: the padded m_splits {padded} sum to {sum(padded)}, inp has {inp.shape[0]} rows"
            )
        if padded == m_splits:
            return inp
        return torch.cat([piece[:m] for piece, m in zip(inp.split(padded), m_splits)])
