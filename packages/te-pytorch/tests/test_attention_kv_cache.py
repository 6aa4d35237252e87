"""InferenceParams: decoding token by token with the KV cache equals the
full-sequence causal attention, for a TransformerLayer with rotary
embeddings, sequences of different prompt lengths, a sequence leaving the
batch, contiguous and paged caches, both backends and both input layouts."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.pytorch.kernels import attention as fused_kernels

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.attention, pytest.mark.module, pytest.mark.usefixtures("te_state")]

H, F, HEADS, GROUPS, L = 32, 48, 4, 2, 9


@pytest.fixture(params=["unfused", "fused"])
def backend(request, monkeypatch):
    if request.param == "fused":
        if not fused_kernels.available():
            pytest.skip("this te-core build has no attention op")
        monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    else:
        monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    return request.param


def _full(layer, x, freqs, fmt):
    """Causal attention over one whole sequence x [s, H] (batch of one)."""
    inp = x[None] if fmt == "bshd" else x[:, None]
    out = layer(inp, rotary_pos_emb=freqs[: x.shape[0]])
    return out[0] if fmt == "bshd" else out[:, 0]


def _batch(rows, fmt):
    """[b, s, H] from per-sequence [s_i, H] pieces (right-padded), in fmt."""
    s = max(r.shape[0] for r in rows)
    out = torch.zeros(len(rows), s, H, device=rows[0].device)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out if fmt == "bshd" else out.transpose(0, 1).contiguous()


def _rows(out, fmt, lens):
    out = out if fmt == "bshd" else out.transpose(0, 1)
    return [out[i, :n] for i, n in enumerate(lens)]


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_decoding_equals_full_attention(device, backend, fmt, paged):
    layer = te.TransformerLayer(
        H,
        F,
        HEADS,
        num_gqa_groups=GROUPS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attn_input_format=fmt,
        device=device,
    ).eval()
    freqs = te.RotaryPositionEmbedding(H // HEADS)(L).to(device)
    seqs = {i: torch.randn(L, H, device=device) for i in range(3)}
    with torch.no_grad():
        want = {i: _full(layer, x, freqs, fmt) for i, x in seqs.items()}
        params = InferenceParamsFor(fmt, paged)
        pos = {0: 3, 1: 5, 2: 2}  # prompt lengths
        params.pre_step(OrderedDict(pos))
        out = layer(
            _batch([seqs[i][: pos[i]] for i in pos], fmt),
            self_attn_mask_type="padding_causal",
            inference_params=params,
            rotary_pos_emb=freqs,
        )
        for i, got in zip(pos, _rows(out, fmt, list(pos.values()))):
            torch.testing.assert_close(got, want[i][: pos[i]], atol=2e-5, rtol=2e-5)
        alive = [0, 1, 2]
        for step in range(4):
            if step == 2:
                alive = [0, 2]  # sequence 1 finishes: the cache rows of the others move up
            params.pre_step(OrderedDict((i, 1) for i in alive))
            out = layer(
                _batch([seqs[i][pos[i] : pos[i] + 1] for i in alive], fmt),
                self_attn_mask_type="padding_causal",
                inference_params=params,
                rotary_pos_emb=freqs,
            )
            for i, got in zip(alive, _rows(out, fmt, [1] * len(alive))):
                torch.testing.assert_close(got[0], want[i][pos[i]], atol=2e-5, rtol=2e-5)
                pos[i] += 1


def InferenceParamsFor(fmt, paged):
    pages = dict(is_paged=True, page_size=3, total_num_pages=9) if paged else {}
    return te.InferenceParams(
        3, L, num_heads_kv=GROUPS, head_dim_k=H // HEADS, dtype=torch.float32, qkv_format=fmt, **pages
    )


def test_inference_params_errors():
    with pytest.raises(ValueError, match="num_heads_kv"):
        te.InferenceParams(2, 8)
    paged = dict(num_heads_kv=1, head_dim_k=4, dtype=torch.float32, is_paged=True)
    with pytest.raises(ValueError, match="total_num_pages"):
        te.InferenceParams(2, 8, page_size=4, total_num_pages=3, **paged)
    with pytest.raises(ValueError, match="page_size"):
        te.InferenceParams(2, 8, page_size=3, total_num_pages=4, **paged)
    params = te.InferenceParams(1, 4, num_heads_kv=1, head_dim_k=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="max_sequence_length"):
        params.pre_step(OrderedDict({0: 5}))
    dpa = te.DotProductAttention(2, 4, num_gqa_groups=1, qkv_format="bshd", attn_mask_type="causal")
    params = te.InferenceParams(1, 4, num_heads_kv=1, head_dim_k=4, dtype=torch.float32)
    params.pre_step(OrderedDict({0: 2}))
    q, kv = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 1, 4)
    with pytest.raises(ValueError, match="padding mask"):
        dpa(q, kv, kv, inference_params=params)
