"""The core's table of activation kinds (TE_ACTIVATION_KINDS in te/activation.h)
as lib.activation_kinds() exports it, and what te-core derives from it."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_engine.core import activation as act
from transformer_engine.core import lib
from transformer_engine.core import reference_activation as ra

# The codes are ABI (te_activation): these must never change; new kinds append.
SHIPPED_CODES = {
    "gelu": 0,
    "relu": 1,
    "silu": 2,
    "qgelu": 3,
    "srelu": 4,
    "geglu": 5,
    "reglu": 6,
    "swiglu": 7,
    "qgeglu": 8,
    "sreglu": 9,
    "glu": 10,
    "clamped_swiglu": 11,
}
SHIPPED_GATED = {"geglu", "reglu", "swiglu", "qgeglu", "sreglu", "glu", "clamped_swiglu"}


def test_table_rows_are_in_code_order_with_unique_names():
    kinds = lib.activation_kinds()
    assert [k["code"] for k in kinds] == list(range(len(kinds)))
    names = [k["name"] for k in kinds]
    assert len(set(names)) == len(names)
    assert all(set(k) == {"name", "code", "gated", "params"} for k in kinds)


def test_shipped_kinds_keep_their_codes_and_gated_flags():
    by_name = {k["name"]: k for k in lib.activation_kinds()}
    for name, code in SHIPPED_CODES.items():
        assert by_name[name]["code"] == code, name
        assert by_name[name]["gated"] == (name in SHIPPED_GATED), name


def test_only_clamped_swiglu_reads_parameters_with_the_reference_defaults():
    with_params = {k["name"]: k["params"] for k in lib.activation_kinds() if k["params"]}
    assert with_params == {"clamped_swiglu": {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0}}


def test_python_names_come_from_the_table():
    kinds = lib.activation_kinds()
    assert act.ACTIVATIONS == tuple(k["name"] for k in kinds)
    assert act.GATED_ACTIVATIONS == {k["name"] for k in kinds if k["gated"]}
    assert act.DEFAULT_PARAMS == {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0}
    assert all(act.is_gated(k["name"]) == k["gated"] for k in kinds)


def test_every_kind_has_an_oracle_formula():
    assert set(ra.BASE) == set(act.ACTIVATIONS)


@pytest.mark.parametrize("kind", act.ACTIVATIONS)
def test_gated_flag_decides_the_output_width(kind):
    x = np.linspace(-3, 3, 2 * 8, dtype=np.float32).reshape(2, 8)
    y = act.activation_forward(x, kind)
    assert y.shape == ((2, 4) if kind in act.GATED_ACTIVATIONS else (2, 8))


@pytest.mark.parametrize("kind", ["swiglu", "qgeglu", "glu", "geglu", "reglu", "sreglu"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_infinite_linear_half_gives_the_limit(kind, dtype):
    """da = grad * f'(a) * lin(b) with lin(b) = +-inf is the limit (+-inf, or 0 for an
    exactly zero factor), the same in the core and the float64 oracle (numerics.md)."""
    import transformer_engine.core as tc

    a_values = np.array([-20000, -500, -100, -30, -1, 0, 0.5, 30, 500, -np.inf, np.inf, np.nan])
    grads = np.array([1.0, -2.0, 0.0])
    a, g, sign = np.meshgrid(a_values, grads, [1.0, -1.0], indexing="ij")
    a, g, b = a.reshape(-1, 1), g.reshape(-1, 1), (sign * np.inf).reshape(-1, 1)
    x = np.concatenate([a, b], axis=-1).astype(dtype)
    grad = g.astype(dtype)
    got = tc.activation_backward(grad, x, kind).grad_input.astype(np.float64)[:, 0]
    expected = ra.backward(grad, x, kind)[:, 0].astype(dtype).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    assert np.array_equal(got[~np.isnan(got)], expected[~np.isnan(expected)])
    finite_inputs = np.isfinite(a[:, 0]) & (g[:, 0] != 0)
    assert not np.isnan(got[finite_inputs]).any(), "0 * inf reached the result"
    if kind in ("swiglu", "qgeglu", "glu", "geglu"):  # slopes that only underflow: never 0 * inf
        assert np.all(np.isinf(got[finite_inputs]))
    # The forward f(a) * lin(b) follows the same rule (grad = 1).
    y = tc.activation_forward(x, kind).astype(np.float64)[:, 0]
    y_expected = ra.forward(x, kind)[:, 0].astype(dtype).astype(np.float64)
    assert np.array_equal(np.isnan(y), np.isnan(y_expected))
    assert np.array_equal(y[~np.isnan(y)], y_expected[~np.isnan(y_expected)])
    assert not np.isnan(y[np.isfinite(a[:, 0])]).any()
