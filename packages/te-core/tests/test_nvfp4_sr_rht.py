"""NVFP4 stochastic rounding (Philox4x32-10) and the random Hadamard transform
on the CPU backend: bit-exact against the NumPy oracle, reproducibility,
unbiasedness and orthogonality."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nvfp4_helpers import (
    COLUMNWISE_SHAPES,
    INPUT_DTYPES,
    ROWWISE_SHAPES,
    assert_same_bytes,
    check_against_oracle,
    hostile,
)

import transformer_engine.core as tc
from transformer_engine.core import reference_nvfp4 as ref
from transformer_engine.core.nvfp4 import RHT_SIGN_MASK

pytestmark = pytest.mark.nvfp4

# Known-answer vectors of Philox4x32-10 (Random123's kat_vectors): counter, key, output.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def seeds(rng, n=1):
    return [int(s) for s in rng.integers(0, 2**63, size=n, dtype=np.int64)]


# ------------------------------------------------------------------ Philox
@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_oracle_philox_known_answers(counter, key, expected):
    words = ref.philox4x32_10([np.uint32(c) for c in counter], [np.uint32(k) for k in key])
    assert [int(w) for w in words] == list(expected)


def test_rht_sign_mask_from_seed(rng):
    assert tc.rht_sign_mask_from_seed(0) == PHILOX_KAT[0][2][0] & 0xFFFF
    for seed in seeds(rng, 5) + [2**64 - 1]:
        assert tc.rht_sign_mask_from_seed(seed) == int(ref.random_words(seed, 0, [0])[0]) & 0xFFFF


def test_random_word_layout():
    """Word j of (seed, offset) is word j % 4 of Philox((j/4, offset), seed)."""
    seed, offset = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    words = ref.random_words(seed, offset, np.arange(8))
    block1 = ref.philox4x32_10(
        [np.uint32(1), np.uint32(0), np.uint32(offset & 0xFFFFFFFF), np.uint32(offset >> 32)],
        [np.uint32(seed & 0xFFFFFFFF), np.uint32(seed >> 32)],
    )
    assert [int(w) for w in words[4:]] == [int(w) for w in block1]


# ------------------------------------------------------ stochastic rounding
@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
def test_stochastic_rowwise_is_bit_exact(rng, shape, dtype):
    x = hostile(rng, shape, dtype)
    seed, offset = seeds(rng, 2)
    out = tc.quantize_nvfp4(x, stochastic_rounding=True, seed=seed, offset=offset)
    check_against_oracle(x, out, stochastic_rounding=True, seed=seed, offset=offset)


@pytest.mark.parametrize("shape", COLUMNWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("block_2d", [False, True])
def test_stochastic_both_directions_are_bit_exact(rng, shape, dtype, block_2d):
    x = hostile(rng, shape, dtype)
    seed, offset = seeds(rng, 2)
    opts = {"columnwise": True, "block_2d": block_2d, "stochastic_rounding": True, "seed": seed, "offset": offset}
    out = tc.quantize_nvfp4(x, **opts)
    check_against_oracle(x, out, **opts)


def test_same_seed_same_bytes_other_seed_or_offset_other_bytes(rng):
    x = rng.standard_normal((64, 128)).astype(np.float32)
    seed, offset = seeds(rng, 2)
    a = tc.quantize_nvfp4(x, columnwise=True, stochastic_rounding=True, seed=seed, offset=offset)
    b = tc.quantize_nvfp4(x, columnwise=True, stochastic_rounding=True, seed=seed, offset=offset)
    c = tc.quantize_nvfp4(x, columnwise=True, stochastic_rounding=True, seed=seed ^ 1, offset=offset)
    d = tc.quantize_nvfp4(x, columnwise=True, stochastic_rounding=True, seed=seed, offset=offset + 1)
    for name in ("rowwise", "columnwise"):
        assert_same_bytes(getattr(a, name), getattr(b, name), name)
        assert (getattr(a, name) != getattr(c, name)).mean() > 0.2
        assert (getattr(a, name) != getattr(d, name)).mean() > 0.2
    assert_same_bytes(a.rowwise_scale, c.rowwise_scale)  # scales do not depend on the randoms
    rowwise_only = tc.quantize_nvfp4(x, stochastic_rounding=True, seed=seed, offset=offset)
    assert_same_bytes(rowwise_only.rowwise, a.rowwise)


def test_stochastic_rounding_probability_is_the_distance():
    """x * enc_b = 0.625 lies a quarter of the way from 0.5 to 1: P(1) = 1/4."""
    x = np.full((256, 64), 0.625, np.float32)
    x[:, ::16] = 6.0  # block amax 6 and a global amax of 2688 make enc_b = 1
    x[0, 0] = 2688.0
    out = tc.quantize_nvfp4(x, stochastic_rounding=True, seed=12345)
    codes = tc.unpack_fp4(out.rowwise).view(np.uint8)[1:].reshape(-1, 16)[:, 1:]
    assert set(np.unique(codes)) <= {1, 2}
    up = (codes == 2).mean()
    assert abs(up - 0.25) < 5 * np.sqrt(0.25 * 0.75 / codes.size)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_stochastic_rounding_is_unbiased(rng, dtype):
    x = (rng.standard_normal((16, 64)) * rng.choice([0.1, 1, 10], size=(16, 1))).astype(dtype)
    xf = x.astype(np.float32)
    amax = ref.amax(xf)
    n = 256
    total = np.zeros(xf.shape)
    for seed in seeds(rng, n):
        out = tc.quantize_nvfp4(x, stochastic_rounding=True, seed=seed)
        total += tc.dequantize_nvfp4(out.rowwise, out.rowwise_scale, amax)
    mean = total / n
    nearest = tc.quantize_nvfp4(x)
    rne = tc.dequantize_nvfp4(nearest.rowwise, nearest.rowwise_scale, amax)
    block_amax = np.repeat(np.abs(xf.reshape(16, 4, 16)).max(-1), 16, axis=-1).reshape(xf.shape)
    sigma = block_amax / 6 * (1 + 1 / 16)  # at most one E2M1 step (2 units) / 2, at the block scale
    # Elements at the block amax may saturate (biased by at most the E4M3 rounding of the scale).
    inside = np.abs(xf) < block_amax * (1 - 1 / 8)
    assert np.all(np.abs(mean - xf)[inside] <= 5 * sigma[inside] / np.sqrt(n) + 1e-6 * block_amax[inside])
    assert np.abs(mean - xf)[inside].mean() < np.abs(rne - xf)[inside].mean() / 4


# ------------------------------------------------------------------ the RHT
def test_hadamard_is_orthogonal_and_the_butterfly_computes_x_times_h(rng):
    for mask in (0, RHT_SIGN_MASK, int(rng.integers(0, 1 << 16))):
        h = ref.hadamard_matrix(mask)
        np.testing.assert_array_equal(h @ h.T, np.eye(16))
        v = rng.standard_normal((50, 16)).astype(np.float32)
        np.testing.assert_allclose(ref.hadamard_fp32(v, mask), v.astype(np.float64) @ h, rtol=0, atol=1e-5)


def test_rht_preserves_products_in_fp64(rng):
    """(X H)(H^T W) = X W, with H block diagonal along the reduction dimension."""
    x = rng.standard_normal((8, 64))
    w = rng.standard_normal((64, 5))
    h = np.kron(np.eye(4), ref.hadamard_matrix(RHT_SIGN_MASK))
    np.testing.assert_allclose((x @ h) @ (h.T @ w), x @ w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", COLUMNWISE_SHAPES)
@pytest.mark.parametrize("dtype", INPUT_DTYPES)
@pytest.mark.parametrize("stochastic", [False, True])
def test_rht_columnwise_is_bit_exact(rng, shape, dtype, stochastic):
    x = hostile(rng, shape, dtype)
    mask = int(rng.choice([0, RHT_SIGN_MASK, int(rng.integers(0, 1 << 16))]))
    seed = seeds(rng)[0]
    opts = {
        "columnwise": True,
        "random_hadamard": True,
        "rht_sign_mask": mask,
        "stochastic_rounding": stochastic,
        "seed": seed,
    }
    out = tc.quantize_nvfp4(x, **opts)
    m, k = x.size // shape[-1], shape[-1]
    expected_amax = ref.amax(ref.columnwise_values(x.astype(np.float32).reshape(m, k), True, mask))
    assert out.amax_columnwise == expected_amax
    assert out.amax_rowwise == ref.amax(x)
    check_against_oracle(x, out, **opts)


def test_rht_amax_is_the_post_transform_amax(rng):
    x = np.zeros((16, 16), np.float32)
    x[:, 3] = 1.0  # a constant column: H16's first row sums it to 16, times 1/4
    row, col = tc.compute_amax_nvfp4(x, random_hadamard=True, rht_sign_mask=0)
    assert row == 1.0 and col == 4.0


def test_rht_wgrad_product_matches_the_unquantized_product(rng):
    """dW = dY^T X from columnwise RHT operands: H cancels along the tokens (M)."""
    m, n, k = 256, 32, 48
    dy = rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    exact = dy.astype(np.float64).T @ x.astype(np.float64)
    errors = {}
    for rht in (False, True):
        a = tc.quantize_nvfp4(dy, rowwise=False, columnwise=True, random_hadamard=rht)
        b = tc.quantize_nvfp4(x, rowwise=False, columnwise=True, random_hadamard=rht)
        da = tc.dequantize_nvfp4(a.columnwise, a.columnwise_scale, a.amax_columnwise).astype(np.float64)
        db = tc.dequantize_nvfp4(b.columnwise, b.columnwise_scale, b.amax_columnwise).astype(np.float64)
        errors[rht] = np.linalg.norm(da @ db.T - exact) / np.linalg.norm(exact)
    assert errors[True] < 0.2 and errors[False] < 0.2, errors


def test_rht_does_not_touch_the_rowwise_copy(rng):
    x = hostile(rng, (32, 64), ml_dtypes.bfloat16)
    plain = tc.quantize_nvfp4(x, columnwise=True)
    rht = tc.quantize_nvfp4(x, columnwise=True, random_hadamard=True)
    assert_same_bytes(rht.rowwise, plain.rowwise)
    assert_same_bytes(rht.rowwise_scale, plain.rowwise_scale)
    assert (rht.columnwise != plain.columnwise).any()
