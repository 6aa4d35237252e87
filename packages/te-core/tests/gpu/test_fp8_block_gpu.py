"""FP8 block scaling: the CUDA backend against the CPU backend, byte for byte.

Each CUDA call runs on device buffers (raw bytes allocated with torch, passed
through `lib.TensorDesc`) and is compared with the CPU backend on NumPy copies
of the same input. FP8 data and FP32 scale_inv (padding included: every
buffer starts filled with 0xA5, so an unwritten byte shows) must be identical;
dequantized NaNs only need to be NaN in the same places. The CPU backend
itself is checked against the NumPy oracle in tests/test_fp8_block.py.
"""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transformer_engine.core as tc
from transformer_engine.core import lib

# Device buffers, hostile inputs and byte comparisons shared with the other CUDA tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cuda_backends import (
    FP8,
    INPUT_DTYPES,
    DeviceArray,
    assert_same_bytes,
    assert_same_values_nan_anywhere,
    make_input,
)

pytestmark = [pytest.mark.gpu, pytest.mark.fp8_block]


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and tc.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


@pytest.fixture
def rng_and_seed():
    seed = int(np.random.SeedSequence().entropy % (2**32))
    return np.random.default_rng(seed), seed


LAYOUT_CODE = {"gemm_ready": 0, "compact": 1}
# Whole tiles, cut tiles in M (130, 217, 1000) and K (144, 272), rank 3, tiny, and
# M not a multiple of 16 (byte-wise transposed stores), plus one multi-tile case.
SHAPES = [
    (128, 128),
    (256, 384),
    (3, 128, 256),
    (130, 256),
    (1, 16),
    (5, 160),
    (217, 272),
    (300, 144),
    (1000, 1024),
    (2, 64, 48),
]


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _desc(d):
    return None if d is None else d.desc


def gpu_quantize(
    x: np.ndarray,
    fmt,
    block_dim,
    layout,
    rowwise=True,
    columnwise=True,
    pow2=True,
    epsilon=0.0,
    in_offset=0,
    out_offset=0,
    scale_offset=0,
):
    """Runs the CUDA quantize; returns the four outputs as NumPy arrays (None if not asked)."""
    shape_kw = {"block_dim": block_dim, "layout": layout}
    dev_x = DeviceArray.of(x, in_offset)
    outs = []
    for wanted, col in ((rowwise, False), (columnwise, True)):
        if not wanted:
            outs += [None, None]
            continue
        rows, cols = int(np.prod(x.shape[:-1])), x.shape[-1]
        data_shape = (cols, rows) if col and layout == "gemm_ready" else x.shape
        outs += [
            DeviceArray(data_shape, FP8[fmt], out_offset),
            DeviceArray(tc.fp8_block_scale_shape(x.shape, columnwise=col, **shape_kw), np.float32, scale_offset),
        ]
    lib.fp8_block_quantize(
        dev_x.desc,
        *(_desc(d) for d in outs),
        block_dim=block_dim,
        layout=LAYOUT_CODE[layout],
        force_pow2_scales=pow2,
        amax_epsilon=epsilon,
        stream=_stream(),
    )
    torch.cuda.synchronize()
    return [None if d is None else d.numpy() for d in outs]


def assert_quantize_matches(
    x, fmt, block_dim, layout, ctx, rowwise=True, columnwise=True, pow2=True, epsilon=0.0, **offsets
):
    got = gpu_quantize(x, fmt, block_dim, layout, rowwise, columnwise, pow2, epsilon, **offsets)
    want = tc.quantize_fp8_block(
        x,
        fmt,
        block_dim=block_dim,
        layout=layout,
        rowwise=rowwise,
        columnwise=columnwise,
        force_pow_2_scales=pow2,
        amax_epsilon=epsilon,
    )
    names = ("rowwise", "rowwise_scale_inv", "columnwise", "columnwise_scale_inv")
    for name, g in zip(names, got):
        w = getattr(want, name)
        assert (g is None) == (w is None), name
        if g is not None:
            assert_same_bytes(g, w, name, ctx)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("kind", ["hostile", "finite", "tiny"])
def test_quantize_both_directions(rng_and_seed, shape, dtype, fmt, block_dim, layout, kind):
    rng, seed = rng_and_seed
    x = make_input(shape, dtype, rng, kind)
    ctx = f"seed={seed}, shape={shape}, {dtype}, {fmt}, {block_dim}-D, {layout}, {kind}"
    assert_quantize_matches(x, fmt, block_dim, layout, ctx)


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("which", ["rowwise", "columnwise"])
@pytest.mark.parametrize("pow2,epsilon", [(True, 0.0), (False, 0.0), (False, 1e-3), (True, 0.5)])
def test_quantize_one_direction_and_options(rng_and_seed, block_dim, layout, which, pow2, epsilon):
    rng, seed = rng_and_seed
    x = make_input((260, 400), np.dtype(ml_dtypes.bfloat16), rng, "finite")
    x[:3] *= np.asarray(1e-6, x.dtype)  # rows under the epsilon
    ctx = f"seed={seed}, {block_dim}-D, {layout}, {which}, pow2={pow2}, eps={epsilon}"
    assert_quantize_matches(
        x,
        "e4m3",
        block_dim,
        layout,
        ctx,
        rowwise=which == "rowwise",
        columnwise=which == "columnwise",
        pow2=pow2,
        epsilon=epsilon,
    )


@pytest.mark.parametrize("dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize(
    "offsets",
    [{"in_offset": 1}, {"out_offset": 1}, {"out_offset": 4, "scale_offset": 4}, {"in_offset": 1, "out_offset": 2}],
    ids=str,
)
def test_unaligned_pointers(rng_and_seed, dtype, block_dim, layout, offsets):
    """Element loads (input not 16-byte aligned) and narrow stores (outputs not aligned)."""
    rng, seed = rng_and_seed
    dtype = np.dtype(dtype)
    x = make_input((144, 272), dtype, rng, "hostile")
    offsets = dict(offsets)
    offsets["in_offset"] = offsets.get("in_offset", 0) * dtype.itemsize  # whole elements only
    ctx = f"seed={seed}, {dtype}, {block_dim}-D, {layout}, {offsets}"
    assert_quantize_matches(x, "e4m3", block_dim, layout, ctx, **offsets)


def test_hostile_blocks(rng_and_seed):
    """A tile of zeros, a tile of NaNs, a tile with inf, subnormal tiles: same bytes as the CPU."""
    rng, seed = rng_and_seed
    x = (rng.standard_normal((256, 512)) * 3).astype(np.float32)
    x[:128, :128] = 0.0
    x[:128, 128:256] = np.nan
    x[5, 300] = np.inf
    x[128:, 384:] = np.float32(2.0**-149) * rng.integers(1, 50, (128, 128))
    for block_dim in (1, 2):
        for pow2 in (True, False):
            for dtype in (np.float32, ml_dtypes.bfloat16):
                xd = x.astype(dtype)
                ctx = f"seed={seed}, {block_dim}-D, pow2={pow2}, {np.dtype(dtype)}"
                assert_quantize_matches(xd, "e4m3", block_dim, "gemm_ready", ctx, pow2=pow2)


def test_large_tensor(rng_and_seed):
    """Many tiles on the vectorized full-tile path (the benchmark's layout, smaller)."""
    rng, seed = rng_and_seed
    x = make_input((2048, 4096), np.dtype(ml_dtypes.bfloat16), rng, "finite")
    for block_dim in (1, 2):
        assert_quantize_matches(x, "e4m3", block_dim, "gemm_ready", f"seed={seed}, {block_dim}-D")


@pytest.mark.parametrize("block_dim", [1, 2])
@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("out_dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(130, 256), (3, 128, 160), (5, 24)])
def test_dequantize(rng_and_seed, block_dim, layout, columnwise, out_dtype, fmt, shape):
    """All 256 codes (NaNs included) with random scales, each stored layout."""
    rng, seed = rng_and_seed
    q = rng.integers(0, 256, shape, dtype=np.uint8).view(FP8[fmt])
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    # The scale array of this stored matrix: GEMM-ready columnwise data of [M, K]
    # is stored [K, M] with the rowwise scale layout of that stored matrix (the
    # flag only matters for compact data).
    scale_shape = tc.fp8_block_scale_shape(
        (rows, cols), block_dim=block_dim, layout=layout, columnwise=columnwise and layout == "compact"
    )
    scales = (2.0 ** rng.integers(-20, 20, scale_shape)).astype(np.float32)
    scales.reshape(-1)[::7] = rng.standard_normal(scales.size)[::7].astype(np.float32)
    dev_q, dev_s = DeviceArray.of(q), DeviceArray.of(scales)
    out = DeviceArray(shape, out_dtype)
    lib.fp8_block_dequantize(
        dev_q.desc, dev_s.desc, out.desc, block_dim, LAYOUT_CODE[layout], columnwise, stream=_stream()
    )
    torch.cuda.synchronize()
    want = tc.dequantize_fp8_block(
        q, scales, block_dim=block_dim, layout=layout, columnwise=columnwise, out_dtype=out_dtype
    )
    ctx = f"seed={seed}, {block_dim}-D, {layout}, col={columnwise}, {np.dtype(out_dtype)}, {fmt}"
    assert_same_values_nan_anywhere(out.numpy(), want, "dequantized", ctx)


@pytest.mark.parametrize("out_dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout,columnwise", [("gemm_ready", False), ("compact", True)])
def test_dequantize_special_scales(rng_and_seed, out_dtype, fmt, layout, columnwise):
    """Scales of +-0, +-inf, NaN, subnormal and huge next to plain ones, one scale per
    row of 16 codes (GEMM-ready) or per column (compact columnwise): the kernel's fast
    path (no NaN code, finite nonzero scales) and its element-wise path side by side."""
    rng, seed = rng_and_seed
    shape = (260, 384)
    q = rng.integers(0, 256, shape, dtype=np.uint8).view(FP8[fmt])
    scale_shape = tc.fp8_block_scale_shape(shape, block_dim=1, layout=layout, columnwise=columnwise)
    scales = (2.0 ** rng.integers(-20, 20, scale_shape)).astype(np.float32)
    flat = scales.reshape(-1)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e38, 2.0**-126], np.float32)
    pick = rng.random(flat.size) < 0.1
    flat[pick] = rng.choice(special, int(pick.sum()))
    dev_q, dev_s = DeviceArray.of(q), DeviceArray.of(scales)
    out = DeviceArray(shape, out_dtype)
    lib.fp8_block_dequantize(dev_q.desc, dev_s.desc, out.desc, 1, LAYOUT_CODE[layout], columnwise, stream=_stream())
    torch.cuda.synchronize()
    want = tc.dequantize_fp8_block(q, scales, block_dim=1, layout=layout, columnwise=columnwise, out_dtype=out_dtype)
    ctx = f"seed={seed}, {layout}, col={columnwise}, {np.dtype(out_dtype)}, {fmt}"
    assert_same_values_nan_anywhere(out.numpy(), want, "dequantized", ctx)


@pytest.mark.parametrize("layout", ["gemm_ready", "compact"])
@pytest.mark.parametrize("shape", [(128, 128), (130, 272), (3, 100, 64), (1000, 1024)])
def test_transpose_2d(rng_and_seed, layout, shape):
    """CUDA transpose of 2-D data and scales == CPU == the columnwise quantization."""
    rng, seed = rng_and_seed
    x = make_input(shape, np.dtype(np.float32), rng, "hostile")
    ref = tc.quantize_fp8_block(x, block_dim=2, layout=layout, columnwise=True)
    row, row_s = DeviceArray.of(ref.rowwise), DeviceArray.of(ref.rowwise_scale_inv)
    col = DeviceArray(ref.columnwise.shape, ref.columnwise.dtype)
    col_s = DeviceArray(ref.columnwise_scale_inv.shape, np.float32)
    lib.fp8_block_transpose_2d(row.desc, row_s.desc, col.desc, col_s.desc, LAYOUT_CODE[layout], stream=_stream())
    torch.cuda.synchronize()
    ctx = f"seed={seed}, {shape}, {layout}"
    assert_same_bytes(col.numpy(), ref.columnwise, "columnwise", ctx)
    assert_same_bytes(col_s.numpy(), ref.columnwise_scale_inv, "columnwise_scale_inv", ctx)


def test_quantize_is_graph_capturable(rng_and_seed):
    """No allocation and no host synchronization: the call records into a CUDA graph."""
    rng, seed = rng_and_seed
    x = make_input((384, 512), np.dtype(ml_dtypes.bfloat16), rng, "finite")
    dev_x = DeviceArray.of(x)
    outs = [
        DeviceArray((384, 512), FP8["e4m3"]),
        DeviceArray((4, 384), np.float32),
        DeviceArray((512, 384), FP8["e4m3"]),
        DeviceArray((3, 512), np.float32),
    ]
    descs = [d.desc for d in outs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # synchronizes first, captures on a side stream
        lib.fp8_block_quantize(
            dev_x.desc, *descs, block_dim=1, layout=0, stream=torch.cuda.current_stream().cuda_stream
        )
    graph.replay()
    torch.cuda.synchronize()
    want = tc.quantize_fp8_block(x, block_dim=1, columnwise=True)
    for d, name in zip(outs, ("rowwise", "rowwise_scale_inv", "columnwise", "columnwise_scale_inv")):
        assert_same_bytes(d.numpy(), getattr(want, name), name, f"seed={seed}")
