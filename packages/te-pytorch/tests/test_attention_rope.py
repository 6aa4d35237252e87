"""RotaryPositionEmbedding and apply_rotary_pos_emb against the float64 RoPE formula.

Pair k of a head (channels (k, k + d2/2), or (2k, 2k + 1) interleaved) at
position p is rotated by the angle p * base^(-2k / d2); channels past d2 pass.
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import cuda_ready

from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding, apply_rotary_pos_emb

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.rope, pytest.mark.module, pytest.mark.usefixtures("te_state")]


def rope64(x, positions, d2, base, interleaved):
    """x [n, h, d] float64 at positions [n] -> rotated copy (explicit loops over pairs)."""
    out = x.clone()
    for k in range(d2 // 2):
        i, j = (2 * k, 2 * k + 1) if interleaved else (k, k + d2 // 2)
        angle = positions.double()[:, None] * base ** (-2.0 * k / d2)
        a, b = x[:, :, i], x[:, :, j]
        out[:, :, i] = a * torch.cos(angle) - b * torch.sin(angle)
        out[:, :, j] = b * torch.cos(angle) + a * torch.sin(angle)
    return out


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("d,percent", [(16, 1.0), (12, 0.5)])
@pytest.mark.parametrize("fused", [False, True])
def test_rope_formula(fmt, interleaved, d, percent, fused):
    s, b, h, base = 7, 3, 2, 500.0
    rope = RotaryPositionEmbedding(d, rotary_percent=percent, rotary_base=base, interleaved=interleaved)
    freqs = rope(s + 2)
    d2 = int(d * percent)
    assert freqs.shape == (s + 2, 1, 1, d2) and freqs.dtype == torch.float32
    x = torch.randn(s, b, h, d, dtype=torch.float64)
    t = (x if fmt == "sbhd" else x.transpose(0, 1)).float().contiguous().requires_grad_()
    y = apply_rotary_pos_emb(t, freqs, tensor_format=fmt, interleaved=interleaved, fused=fused)
    y_sb = y if fmt == "sbhd" else y.transpose(0, 1)
    pos = torch.arange(s)
    for bi in range(b):
        want = rope64(x[:, bi], pos, d2, base, interleaved)
        assert (y_sb[:, bi].double() - want).abs().max() < 1e-5
    # A rotation: the gradient of sum(y * g) is the inverse rotation of g.
    g = torch.randn_like(y)
    y.backward(g)
    g_sb = (g if fmt == "sbhd" else g.transpose(0, 1)).double()
    for bi in range(b):
        want = rope64(g_sb[:, bi], -pos, d2, base, interleaved)
        got = (t.grad if fmt == "sbhd" else t.grad.transpose(0, 1))[:, bi].double()
        assert (got - want).abs().max() < 1e-5


@pytest.mark.parametrize("fused", [False, True])
def test_rope_start_positions_and_thd(fused):
    s, b, h, d = 5, 3, 2, 8
    freqs = RotaryPositionEmbedding(d)(32)
    x = torch.randn(b, s, h, d, dtype=torch.float64)
    start = torch.tensor([0, 4, 9], dtype=torch.int32)
    y = apply_rotary_pos_emb(x.float(), freqs, tensor_format="bshd", start_positions=start, fused=fused)
    for bi in range(b):
        want = rope64(x[bi], torch.arange(s) + int(start[bi]), d, 10000.0, False)
        assert (y[bi].double() - want).abs().max() < 1e-5
    lens = [3, 5, 1]
    cu = torch.tensor([0, 3, 8, 9], dtype=torch.int32)
    t = torch.randn(11, h, d, dtype=torch.float64)  # (2 tokens past the last sequence: passed through)
    y = apply_rotary_pos_emb(t.float(), freqs, tensor_format="thd", cu_seqlens=cu, fused=fused)
    for bi, n in enumerate(lens):
        piece = t[int(cu[bi]) : int(cu[bi]) + n]
        want = rope64(piece, torch.arange(n), d, 10000.0, False)
        assert (y[int(cu[bi]) : int(cu[bi]) + n].double() - want).abs().max() < 1e-5
    assert torch.equal(y[9:], t[9:].float())


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
def test_rope_fused_bf16_within_rounding_of_unfused(fmt):
    """BF16: the fused kernel (FP32 math, one rounding) and the unfused torch
    math (BF16 products) each lie within a few BF16 roundings of the float64
    formula; forward and backward."""
    freqs = RotaryPositionEmbedding(16)(12)
    shape = {"sbhd": (7, 2, 3, 16), "bshd": (2, 7, 3, 16), "thd": (9, 3, 16)}[fmt]
    cu = torch.tensor([0, 4, 9], dtype=torch.int32) if fmt == "thd" else None
    x = torch.randn(shape).bfloat16()
    g = torch.randn(shape).bfloat16()
    outs = []
    for fused in (False, True):
        t = x.clone().requires_grad_()
        y = apply_rotary_pos_emb(t, freqs, tensor_format=fmt, cu_seqlens=cu, fused=fused)
        y.backward(g)
        outs.append((y.detach().double(), t.grad.double()))
    u = 2.0**-8
    for (ya, ga), (yb, gb) in [outs]:
        # each |y| <= sqrt(2) max|x|; unfused: cos/sin and two products and a sum rounded (<= 5u)
        assert (ya - yb).abs().max() <= 6 * u * 1.5 * x.abs().max().double()
        assert (ga - gb).abs().max() <= 6 * u * 1.5 * g.abs().max().double()


@pytest.mark.parametrize("fused", [False, True])
def test_rope_interpolation_and_cp(fused):
    d = 8
    rope = RotaryPositionEmbedding(d, seq_len_interpolation_factor=2, pretrained_max_position_embeddings=8)
    f = rope(6)  # 6 <= 8 * 2: positions / 2
    want = torch.outer(torch.arange(6).double() / 2, 10000.0 ** (-torch.arange(0, d, 2).double() / d))
    assert (f[:, 0, 0, : d // 2].double() - want).abs().max() < 1e-5
    f = rope(20)  # dynamic: positions * 8 / 20
    want = torch.outer(torch.arange(20).double() * 8 / 20, 10000.0 ** (-torch.arange(0, d, 2).double() / d))
    assert (f[:, 0, 0, : d // 2].double() - want).abs().max() < 1e-5
    # context parallel rank 1 of 2 with 4 local tokens holds positions 2, 3 and 4, 5 of 8
    freqs = RotaryPositionEmbedding(d)(8)
    x = torch.randn(4, 1, 1, d, dtype=torch.float64)
    y = apply_rotary_pos_emb(x.float(), freqs, tensor_format="sbhd", cp_size=2, cp_rank=1, fused=fused)
    want = rope64(x[:, 0], torch.tensor([2, 3, 4, 5]), d, 10000.0, False)
    assert (y[:, 0].double() - want).abs().max() < 1e-5


def test_rope_errors():
    freqs = RotaryPositionEmbedding(8)(4)
    with pytest.raises(ValueError, match="tensor_format"):
        apply_rotary_pos_emb(torch.randn(4, 1, 1, 8), freqs, tensor_format="hsbd")
    with pytest.raises(ValueError, match="cu_seqlens"):
        apply_rotary_pos_emb(torch.randn(4, 1, 8), freqs, tensor_format="thd")
    with pytest.raises(ValueError, match="positions"):
        apply_rotary_pos_emb(torch.randn(6, 1, 1, 8), freqs)
    with pytest.raises(Exception, match="freqs|position"):  # (te-core's CPU backend checks every position)
        apply_rotary_pos_emb(torch.randn(6, 1, 1, 8), freqs, fused=True)
    with pytest.raises(ValueError, match="cu_seqlens"):
        apply_rotary_pos_emb(torch.randn(4, 1, 8), freqs, tensor_format="thd", fused=True)
    with pytest.raises(ValueError, match="even"):
        RotaryPositionEmbedding(7)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
def test_rope_fused_cuda_against_the_formula(fmt):
    """The fused kernel on CUDA (FP32 math, the device's sin/cos within 2 ulp),
    forward and backward, against float64; thd's cu_seqlens stay on the device."""
    if not cuda_ready():
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    d, base = 16, 10000.0
    freqs = RotaryPositionEmbedding(d)(40).cuda()
    shape = {"sbhd": (33, 2, 3, d), "bshd": (2, 33, 3, d), "thd": (41, 3, d)}[fmt]
    x = torch.randn(shape, dtype=torch.float64)
    t = x.float().cuda().requires_grad_()
    cu = torch.tensor([0, 7, 40], dtype=torch.int32)
    kw = {"cu_seqlens": cu.cuda()} if fmt == "thd" else {}
    y = apply_rotary_pos_emb(t, freqs, tensor_format=fmt, fused=True, **kw)
    g = torch.randn(shape, dtype=torch.float64)
    y.backward(g.float().cuda())
    if fmt == "thd":
        pieces = [(slice(0, 7), torch.arange(7)), (slice(7, 40), torch.arange(33))]
        for rows, pos in pieces:
            assert (y[rows].double().cpu() - rope64(x[rows], pos, d, base, False)).abs().max() < 1e-4
            assert (t.grad[rows].double().cpu() - rope64(g[rows], -pos, d, base, False)).abs().max() < 1e-4
        assert torch.equal(y[40:].cpu(), x[40:].float())  # (past the last sequence: unchanged)
        return
    sb = (lambda a: a) if fmt == "sbhd" else (lambda a: a.transpose(0, 1))
    pos = torch.arange(33)
    for bi in range(2):
        want = rope64(sb(x)[:, bi], pos, d, base, False)
        assert (sb(y).detach()[:, bi].double().cpu() - want).abs().max() < 1e-4
        want_g = rope64(sb(g)[:, bi], -pos, d, base, False)
        assert (sb(t.grad)[:, bi].double().cpu() - want_g).abs().max() < 1e-4
