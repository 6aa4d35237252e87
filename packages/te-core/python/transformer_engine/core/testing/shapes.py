"""Input shapes the test suites share. Odd on purpose: a single row, a few
rows, rows that are no power of two, 4-D, 1-D, a single column, an odd matrix
(each backend's tail and threading paths)."""

from __future__ import annotations

# Elementwise ops (quantize, transpose, activations, ...).
SHAPES = [(1, 16), (5, 160), (217, 256), (2, 3, 5, 64), (7,), (3, 1), (33, 17)]
# A gated activation's input: the last dimension splits into two halves.
GATED_SHAPES = [(1, 16), (5, 160), (217, 256), (2, 3, 5, 64)]
# Normalizations: the rows above plus one long row (the looped paths).
NORM_SHAPES = [(1, 16), (5, 160), (217, 256), (2, 3, 5, 64), (3, 4096)]
