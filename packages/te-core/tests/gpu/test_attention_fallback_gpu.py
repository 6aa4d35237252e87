"""The core's own CUDA attention kernel (the fallback where cuDNN has no engine;
NVTE_FUSED_ATTN=0 forces it) against the float64 oracle within the bounds of
attention_helpers and against the CPU backend within twice them, forward and
backward, over the cases of the CPU tests (test_attention.py): every mask type
and layout, GQA/MQA, windows, bias types and broadcasts, ALiBi, softmax variants,
odd shapes, thd with padded offsets and empty sequences, dropout (the keep mask
bit for bit equal to the CPU's), large head dimensions (scratch beyond shared
memory), determinism, CUDA-graph capture."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attention_gpu_helpers import check_gpu, gpu_run  # noqa: E402
from attention_helpers import DTYPES, rand  # noqa: E402
from test_attention import MASKS, make, mask_opts, random_case, thd_case  # noqa: E402

import transformer_engine.core as tec  # noqa: E402

pytestmark = [pytest.mark.attention, pytest.mark.gpu]


@pytest.fixture(autouse=True)
def _fallback(monkeypatch):
    if not (torch.cuda.is_available() and tec.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")  # the core's kernel even where cuDNN is built in


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask", MASKS)
def test_masks_and_layouts(rng, dtype, fmt, mask):
    q, k, v, d_o = make(rng, dtype, fmt)
    check_gpu(q, k, v, d_o, {"qkv_format": fmt, **mask_opts(rng, mask, 2, 4, 7, 9)}, dtype)


@pytest.mark.parametrize("hk", [1, 2, 4])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_gqa_mqa(rng, hk, mask):
    q, k, v, d_o = make(rng, "fp32", h=4, hk=hk)
    check_gpu(q, k, v, d_o, {"attn_mask_type": mask}, "fp32")


@pytest.mark.parametrize(
    "mask,window,sq,skv",
    [
        ("causal", (2, 0), 9, 9),
        ("causal", (0, -1), 9, 9),
        ("no_mask", (3, 1), 7, 11),
        ("no_mask", (-1, 2), 11, 7),
        ("no_mask", (0, 0), 8, 8),
        ("causal_bottom_right", (3, 0), 5, 12),
        ("padding_causal", (2, 0), 9, 9),
        ("padding", (1, 1), 9, 6),
        ("arbitrary", (4, 2), 8, 10),
        ("causal", (40, 0), 200, 200),  # windows across several key tiles
        ("no_mask", (70, 5), 150, 260),
    ],
)
def test_windows(rng, mask, window, sq, skv):
    q, k, v, d_o = make(rng, "fp32", sq=sq, skv=skv)
    check_gpu(q, k, v, d_o, {**mask_opts(rng, mask, 2, 4, sq, skv), "window_size": window}, "fp32")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("bias_type", ["pre_scale_bias", "post_scale_bias"])
@pytest.mark.parametrize("bias_shape", [(1, 4), (2, 1), (1, 1), (2, 4)])
def test_bias(rng, dtype, bias_type, bias_shape):
    q, k, v, d_o = make(rng, dtype)
    bias = rand(rng, (*bias_shape, 7, 9), dtype)
    opts = {"attn_bias_type": bias_type, "attn_bias": bias, "attn_mask_type": "causal_bottom_right"}
    check_gpu(q, k, v, d_o, opts, dtype)


def test_bias_long_rows(rng):
    """dbias rows across several query and key tiles, broadcast over the batch."""
    q, k, v, d_o = make(rng, "fp32", b=2, sq=70, skv=140, h=2, hk=1)
    bias = rand(rng, (1, 2, 70, 140), "fp32")
    opts = {"attn_bias_type": "post_scale_bias", "attn_bias": bias, "attn_mask_type": "padding"}
    opts.update(mask_opts(rng, "padding", 2, 2, 70, 140))
    check_gpu(q, k, v, d_o, opts, "fp32")


@pytest.mark.parametrize("h", [4, 6])
@pytest.mark.parametrize("slopes", [None, "per_head", "per_batch"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding_causal_bottom_right"])
def test_alibi(rng, h, slopes, mask):
    q, k, v, d_o = make(rng, "fp32", h=h, hk=2, sq=6, skv=10)
    opts = {"attn_bias_type": "alibi", **mask_opts(rng, mask, 2, h, 6, 10)}
    if slopes == "per_head":
        opts["alibi_slopes"] = rng.random(h).astype(np.float32)
    elif slopes == "per_batch":
        opts["alibi_slopes"] = rng.random((2, h)).astype(np.float32)
    check_gpu(q, k, v, d_o, opts, "fp32")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("softmax", ["off_by_one", "learnable"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding"])
def test_softmax_variants(rng, dtype, softmax, mask):
    q, k, v, d_o = make(rng, dtype)
    opts = {"softmax_type": softmax, **mask_opts(rng, mask, 2, 4, 7, 9)}
    if softmax == "learnable":
        opts["softmax_offset"] = rng.standard_normal(4).astype(np.float32)
    check_gpu(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize(
    "b,sq,skv,h,hk,d,dv",
    [
        (3, 5, 13, 2, 1, 72, 72),
        (1, 1, 1, 1, 1, 4, 3),
        (3, 70, 33, 3, 3, 16, 24),
        (2, 33, 130, 2, 2, 8, 8),
        (1, 40, 70, 2, 1, 256, 256),  # the largest head size that stays in shared memory
        (1, 37, 66, 2, 2, 512, 512),  # scratch spills into workspace slices
        (1, 9, 70, 2, 1, 1000, 40),
    ],
)
def test_odd_shapes_and_head_sizes(rng, b, sq, skv, h, hk, d, dv):
    for mask in ["no_mask", "causal_bottom_right"]:
        q, k, v, d_o = make(rng, "bf16", b=b, sq=sq, skv=skv, h=h, hk=hk, d=d, dv=dv)
        check_gpu(q, k, v, d_o, {"attn_mask_type": mask}, "bf16")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mask", ["padding", "padding_causal", "padding_causal_bottom_right", "causal"])
@pytest.mark.parametrize("padded", [False, True])
def test_thd(rng, dtype, mask, padded):
    pads = ([2, 0, 3], [1, 4, 0]) if padded else (None, None)
    q, k, v, d_o, opts = thd_case(rng, dtype, [3, 7, 1], [5, 7, 4], *pads)
    g = check_gpu(q, k, v, d_o, {**opts, "attn_mask_type": mask, "window_size": (4, -1)}, dtype)
    inside = np.zeros(q.shape[0], bool)
    for n, o in zip([3, 7, 1], opts.get("cu_seqlens_q_padded", opts["cu_seqlens_q"])):
        inside[o : o + n] = True
    assert not g.o[~inside].any() and np.isneginf(g.softmax_lse[~inside]).all() and not g.dq[~inside].any()


def test_thd_empty_sequence_and_long(rng):
    q, k, v, d_o, opts = thd_case(rng, "fp32", [4, 0, 3], [2, 3, 0])
    check_gpu(q, k, v, d_o, {**opts, "attn_mask_type": "padding"}, "fp32")
    q, k, v, d_o, opts = thd_case(rng, "bf16", [100, 37, 200], [90, 150, 200], [5, 0, 7], [0, 3, 1])
    check_gpu(q, k, v, d_o, {**opts, "attn_mask_type": "padding_causal_bottom_right"}, "bf16")


@pytest.mark.parametrize("case", range(40))
def test_random_combinations(case):
    """The CPU tests' random combinations of every feature (same seeds)."""
    q, k, v, d_o, opts, dtype = random_case(np.random.default_rng(1000 + case))
    check_gpu(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize("case", range(8))
def test_random_combinations_over_several_tiles(case):
    """The CPU tests' random combinations over several query and key tiles (same seeds)."""
    q, k, v, d_o, opts, dtype = random_case(np.random.default_rng(9000 + case), long=True)
    check_gpu(q, k, v, d_o, opts, dtype)


@pytest.mark.parametrize("case", range(12))
def test_random_thd(case):
    """Random packed batches with sequences across several tiles, padded apart or not."""
    rng = np.random.default_rng(7000 + case)
    b = int(rng.integers(1, 5))
    lq, lkv = [int(x) for x in rng.integers(0, 150, b)], [int(x) for x in rng.integers(0, 150, b)]
    pads = ([int(x) for x in rng.integers(0, 4, b)], [int(x) for x in rng.integers(0, 4, b)])
    dtype = str(rng.choice(list(DTYPES)))
    q, k, v, d_o, opts = thd_case(rng, dtype, lq, lkv, *(pads if case % 2 else (None, None)))
    mask = str(rng.choice(["padding", "padding_causal", "padding_causal_bottom_right"]))
    opts.update(attn_mask_type=mask, window_size=(int(rng.integers(-1, 90)), -1 if "causal" in mask else 30))
    if case % 3 == 0:
        bias = rand(rng, (1, 4, opts["max_seqlen_q"], opts["max_seqlen_kv"]), dtype)
        opts.update(attn_bias_type="post_scale_bias", attn_bias=bias)
    if case % 4 == 1:
        opts.update(dropout=0.3, rng_state=(int(rng.integers(1 << 62)), 5))
    check_gpu(q, k, v, d_o, opts, dtype)


def _keep_mask_problem(b=2, h=3, sq=5, skv=80):
    """q = 0 makes P uniform and v = I makes O = P': O holds the keep mask / (skv (1 - p))."""
    q = np.zeros((b, sq, h, 4), np.float32)
    k = np.ones((b, skv, 1, 4), np.float32)
    v = np.broadcast_to(np.eye(skv, dtype=np.float32)[None, :, None, :], (b, skv, 1, skv)).copy()
    return q, k, v, np.zeros((b, sq, h, skv), np.float32)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("rng_on_device", [False, True], ids=["host_rng", "device_rng"])
def test_dropout_keep_mask_equals_the_cpu(p, rng_on_device):
    q, k, v, d_o = _keep_mask_problem()
    opts = {"dropout": p, "rng_state": (0x1234_5678_9ABC, 77)}
    g = gpu_run(q, k, v, d_o, opts, rng_on_device)
    cpu = tec.attention_fwd(q, k, v, **opts).o
    np.testing.assert_array_equal(g.o.view(np.uint32), cpu.view(np.uint32))
    assert 0 < (g.o > 0).mean() < 1


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "padding"])
def test_dropout_against_oracle(rng, dtype, mask):
    q, k, v, d_o = make(rng, dtype, sq=40, skv=100)
    opts = {"dropout": 0.3, "rng_state": (int(rng.integers(1 << 62)), 3), **mask_opts(rng, mask, 2, 4, 40, 100)}
    check_gpu(q, k, v, d_o, opts, dtype)
    check_gpu(q, k, v, d_o, opts, dtype, rng_on_device=False)


def test_dropout_thd(rng):
    q, k, v, d_o, opts = thd_case(rng, "fp32", [3, 6], [5, 2], [1, 2], [0, 3])
    opts.update(dropout=0.25, rng_state=(99, 1), attn_mask_type="padding_causal_bottom_right")
    check_gpu(q, k, v, d_o, opts, "fp32")


def test_large_logits_and_empty_rows(rng):
    q, k, v, d_o = make(rng, "fp32", d=16)
    q *= 40.0
    check_gpu(q, k, v, d_o, {"attn_scale": 1.0, "attn_mask_type": "causal"}, "fp32")
    q, k, v, d_o = make(rng, "fp32", sq=9, skv=4)
    mask = np.zeros((2, 4, 9, 4), bool)
    mask[:, :, 2] = True
    for softmax in ["vanilla", "off_by_one", "learnable"]:
        opts = {"attn_mask_type": "arbitrary", "attn_mask": mask, "softmax_type": softmax}
        if softmax == "learnable":
            opts["softmax_offset"] = np.array([0.5, -1, 2, 0], np.float32)
        g = check_gpu(q, k, v, d_o, opts, "fp32")
        assert np.isneginf(g.softmax_lse[:, :, 2]).all() and not g.o[:, 2].any() and not g.dq[:, 2].any()
    g = check_gpu(q, k, v, d_o, {"attn_mask_type": "causal_bottom_right"}, "fp32")
    assert np.isneginf(g.softmax_lse[:, :, :5]).all()


def test_long_causal_gqa(rng):
    q, k, v, d_o = make(rng, "bf16", b=1, sq=1024, skv=1024, h=4, hk=2, d=64)
    check_gpu(q, k, v, d_o, {"attn_mask_type": "causal"}, "bf16")


def test_deterministic(rng):
    q, k, v, d_o = make(rng, "fp32", sq=100, skv=150)
    bias = rand(rng, (1, 1, 100, 150), "fp32")
    opts = {"attn_mask_type": "causal_bottom_right", "attn_bias_type": "post_scale_bias", "attn_bias": bias}
    a, b = gpu_run(q, k, v, d_o, opts), gpu_run(q, k, v, d_o, {**opts, "deterministic": True})
    for x, y in zip(a[:6], b[:6]):
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


def test_cuda_graph_capture(rng):
    """Forward and backward captured in a CUDA graph replay to the eager results."""
    from attention_gpu_helpers import _workspace, device_args
    from gemm_gpu_helpers import DeviceArray

    from transformer_engine.core import lib

    q, k, v, d_o = make(rng, "bf16", sq=50, skv=70)
    opts = {"attn_mask_type": "causal", "dropout": 0.2, "rng_state": (7, 0)}
    eager = gpu_run(q, k, v, d_o, opts)
    (gq, gk, gv), args, _held = device_args(q, k, v, opts)
    o = DeviceArray((*q.shape[:-1], v.shape[-1]), q.dtype)
    lse = DeviceArray((2, 4, 50), np.float32)  # [B, H, Sq]
    gdo = DeviceArray.of(d_o)
    dq, dk, dv = DeviceArray(q.shape, q.dtype), DeviceArray(k.shape, k.dtype), DeviceArray(v.shape, v.dtype)
    wf = _workspace(lib.attention_fwd_workspace_size(gq.desc(), gk.desc(), gv.desc(), **args))
    wb = _workspace(lib.attention_bwd_workspace_size(gq.desc(), gk.desc(), gv.desc(), **args))
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        s = torch.cuda.current_stream().cuda_stream
        lib.attention_fwd(gq.desc(), gk.desc(), gv.desc(), o.desc(), lse.desc(), **args,
                          workspace=None if wf is None else wf.desc(), stream=s)  # fmt: skip
        lib.attention_bwd(gq.desc(), gk.desc(), gv.desc(), o.desc(), gdo.desc(), lse.desc(), dq.desc(),
                          dk.desc(), dv.desc(), **args, workspace=None if wb is None else wb.desc(),
                          stream=s)  # fmt: skip
    graph.replay()
    torch.cuda.synchronize()
    for got, want in [(o, eager.o), (lse, eager.softmax_lse), (dq, eager.dq), (dk, eager.dk), (dv, eager.dv)]:
        np.testing.assert_array_equal(got.numpy().view(np.uint8), np.asarray(want).view(np.uint8))
