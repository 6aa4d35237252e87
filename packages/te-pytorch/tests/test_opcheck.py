"""torch.library.opcheck on every registered torch.ops.te.* operator (CPU, small odd shapes).

opcheck's default utilities run on each case: test_schema (declared mutations
and no aliasing), test_autograd_registration, test_faketensor (the shape rule
agrees with the implementation's outputs) and test_aot_dispatch_dynamic. No op
skips one. te-core's block rules need some dimensions to be multiples of 16
(FP8 GEMMs, FP8 block scaling's last dim, NVFP4) or 32 (MXFP8): those cases
use such shapes, every other case odd ones. The last test checks that the cases
cover every op registered in the `te` namespace.
"""

from __future__ import annotations

import pytest
import torch

from transformer_engine.core.nvfp4 import RHT_SIGN_MASK
from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels._common import op_arguments
from transformer_engine.pytorch.kernels.attention import AttentionConfig, AttentionTensors

E4M3, E5M2 = 7, 8


def _cast_cases(x):
    q = kernels.quantize_fp8_current_scaling(x, E4M3)[0]  # (no NaN bytes: the outputs compare equal)
    one, zero = torch.ones(1), torch.zeros(1)
    return [
        ("quantize_fp8", (x, one, zero, E4M3, True, True), {}),
        ("quantize_fp8", (x, one, None, E5M2), {"columnwise": True, "rowwise": False}),
        ("quantize_fp8_current_scaling", (x, E5M2, True, False, True, 0.0), {}),
        ("dequantize_fp8", (q, one, E4M3, torch.bfloat16), {}),
        ("compute_amax", (x,), {}),
        ("compute_scale_from_amax", (torch.tensor([3.0]), E4M3, False, 0.0), {}),
        ("transpose", (q,), {}),
        ("delayed_scaling_update", (None, [torch.rand(4, 3)], [torch.ones(3)]), {"fp8_dtype": E4M3}),
        ("delayed_scaling_update", (torch.rand(3), [torch.rand(2, 3)], [torch.ones(3)]), {"fp8_dtype": E5M2}),
    ]


def _gemm_cases():
    a, w = torch.randn(5, 7), torch.randn(3, 7)
    x16, w16 = torch.randn(32, 48), torch.randn(16, 48)
    q = kernels.quantize_fp8_current_scaling(x16, E4M3)[0]
    q8 = kernels.quantize_fp8_current_scaling(w16, E5M2)[0]
    one = torch.ones(1)
    fp8 = {"a_dtype": E4M3, "a_scale_inv": one, "b_dtype": E5M2, "b_scale_inv": one}
    return [
        ("gemm", (a, w), {"transb": True, "bias": torch.randn(3), "gelu": True, "bias_grad": True}),
        ("gemm", (a.T.contiguous(), w.T.contiguous()), {"transa": True, "out_dtype": torch.bfloat16}),
        ("gemm", (q, q8), {"transb": True, "out_dtype": torch.bfloat16, **fp8}),
        ("gemm_accumulate", (a, w.T.contiguous(), torch.zeros(5, 3)), {"bias_grad": True}),
        ("gemm_accumulate", (q, q8, torch.zeros(32, 16)), {"beta": 0.0, "transb": True, **fp8}),
    ]


def _norm_cases(x):
    h = x.shape[-1]
    gamma, beta = torch.randn(h), torch.randn(h)
    mu, rsigma = torch.randn(x.shape[0]), torch.rand(x.shape[0]) + 0.5
    dz = torch.randn_like(x)
    fp8 = {"fp8_dtype": E4M3, "scale": torch.ones(1), "amax": torch.zeros(1)}
    return [
        ("layernorm_fwd", (x, gamma, beta, 1e-5), {}),
        ("layernorm_fwd", (x, gamma, beta, 1e-5, True), {"out_dtype": torch.bfloat16, "amax": torch.zeros(1)}),
        ("rmsnorm_fwd", (x, gamma, 1e-5, True), fp8),
        ("layernorm_bwd", (dz, x, mu, rsigma, gamma), {}),
        ("rmsnorm_bwd", (dz, x, rsigma, gamma, True), {}),
    ]


def _activation_cases():
    x, dy_half = torch.randn(5, 6), torch.randn(5, 3)
    scale, amax = torch.ones(1), torch.zeros(1)
    fused = {"fwd_fp8_dtype": E4M3, "fwd_scale": scale}
    return [
        ("activation_fwd", (x, "gelu"), {}),
        ("activation_fwd", (x, "swiglu"), {"fp8_dtype": E4M3, "scale": scale, "amax": amax, "columnwise": True}),
        ("activation_bwd", (dy_half, x, "swiglu"), {"dbias": True}),
        (
            "activation_bwd",
            (torch.randn(5, 6), x, "relu"),
            {"fp8_dtype": E5M2, "scale": scale, "rowwise": False, "columnwise": True},
        ),
        ("activation_bwd_fwd_columnwise", (dy_half, x, "geglu"), {"amax": amax, "dbias": True, **fused}),
        (
            "activation_bwd_fwd_columnwise",
            (dy_half, x, "clamped_swiglu"),
            {"fp8_dtype": E5M2, "scale": scale, "columnwise": True, "fwd_values_dtype": torch.bfloat16, **fused},
        ),
    ]


def _block_cases():
    x = torch.randn(64, 96)
    rng = torch.tensor([7, 0], dtype=torch.int64)
    row, row_s, _, _ = kernels.quantize_mxfp8(x, E4M3)
    b = kernels.quantize_fp8_block(x, E4M3, 2)
    f = kernels.quantize_nvfp4(x)
    m = kernels.quantize_mxfp8(x, E4M3, True, True)
    w = kernels.quantize_mxfp8(torch.randn(32, 96), E4M3, True, True)
    a_op, b_op = (m[0], 4, E4M3, m[1], None, False), (w[0], 4, E4M3, w[1], None, False)
    return [
        ("quantize_mxfp8", (x, E4M3, True, True), {"use_2d_blocks": True}),
        ("dequantize_mxfp8", (row, row_s, E4M3), {"out_dtype": torch.bfloat16}),
        ("quantize_fp8_block", (torch.randn(5, 48), E4M3, 1, True, True, True, 0.0), {}),
        ("quantize_fp8_block", (x, E5M2, 2), {"columnwise": True}),
        ("dequantize_fp8_block", (b[0], b[1], E4M3, 2, False, torch.bfloat16), {}),
        ("quantize_nvfp4", (x, True, True, False, True, True, RHT_SIGN_MASK, rng, None), {}),
        ("quantize_nvfp4", (x,), {"amax": torch.tensor([3.0, 4.0])}),
        ("dequantize_nvfp4", (f[0], f[1], f[4][0:1]), {}),
        ("gemm_block", (*a_op, *b_op), {"bias": torch.randn(32)}),
        ("gemm_block_accumulate", (*a_op, *b_op, torch.zeros(64, 32)), {"beta": 0.5}),
    ]


def _attention_cases():
    """GQA with a post-scale bias (causal) and thd with a learnable softmax and dropout."""
    q, k, v = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 6)
    bias = torch.randn(1, 4, 5, 5)
    none8 = (None,) * 8
    causal = (0, 2, 2, 0, 0.35, 0.0, -1, 0, 0, 0, False)
    o, lse = kernels.attention_fwd(q, k, v, AttentionTensors(bias, *none8), AttentionConfig(*causal))
    cu = torch.tensor([0, 2, 7], dtype=torch.int32)
    tq, tk, tv = torch.randn(7, 4, 8), torch.randn(7, 2, 8), torch.randn(7, 2, 8)
    offset, rng = torch.randn(4), torch.tensor([5, 0], dtype=torch.int64)
    thd = (2, 1, 0, 2, 0.35, 0.2, -1, -1, 5, 5, False)
    packed = (None, None, cu, cu, None, None, None, offset, rng)
    to, tlse = kernels.attention_fwd(tq, tk, tv, AttentionTensors(*packed), AttentionConfig(*thd))
    return [
        ("attention_fwd", (q, k, v, bias, *none8, *causal), {}),
        ("attention_bwd", (q, k, v, o, torch.randn_like(o), lse, bias, *none8, *causal), {}),
        ("attention_fwd", (tq, tk, tv, *packed, *thd), {}),
        ("attention_bwd", (tq, tk, tv, to, torch.randn_like(to), tlse, *packed, *thd), {}),
    ]


def _rope_cases():
    freqs = torch.rand(9, 1, 1, 6) * 3
    t, cu = torch.randn(7, 2, 8), torch.tensor([0, 3, 7], dtype=torch.int32)
    return [
        ("rope_fwd", (torch.randn(2, 5, 3, 8), freqs, None, torch.tensor([0, 2], dtype=torch.int32), 0, False), {}),
        ("rope_fwd", (t, freqs, cu, None, 2, True), {}),
        ("rope_bwd", (torch.randn(5, 2, 3, 8), freqs, None, None, 1, False), {"cp_size": 1, "cp_rank": 0}),
    ]


def _cases():
    x = torch.randn(5, 7) * 3
    cases = _cast_cases(x) + _gemm_cases() + _norm_cases(x) + _activation_cases() + _block_cases()
    return cases + _attention_cases() + _rope_cases()


_CASES = _cases()


@pytest.mark.parametrize("case", range(len(_CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(_CASES)])
def test_opcheck(case):
    torch.manual_seed(case)
    name, args, kwargs = _cases()[case]  # (fresh tensors: the cases mutate amaxes and histories)
    torch.library.opcheck(getattr(torch.ops.te, name).default, op_arguments(name, args, kwargs))


def test_every_registered_op_is_checked():
    registered = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("te::")}
    assert registered == {name for name, _, _ in _CASES}
