"""The attention family on raw device buffers (the `device` fixture): the
NumPy-level attention_fwd / attention_bwd of transformer_engine.core.attention
with every tensor copied to the test's device, and the checks each backend
must pass (the float64 oracle's bounds, the NumPy API -- the CPU backend --
within twice them). On CUDA the tests force the core's own kernel (the
fallback where cuDNN has no engine)."""

from __future__ import annotations

from typing import NamedTuple

import core_device
import numpy as np
from attention_helpers import TINY_OUT, U_OUT, Oracle, assert_close, core_run
from gemm_device import DeviceArray

from transformer_engine.core import attention as att
from transformer_engine.core import lib

# The optional tensors of attention._config, in the order of its `keep` list after q, k, v.
OPTIONAL = [
    "bias",
    "alibi_slopes",
    "cu_seqlens_q",
    "cu_seqlens_kv",
    "cu_seqlens_q_padded",
    "cu_seqlens_kv_padded",
    "attn_mask",
    "softmax_offset",
    "rng_state",
]


class DeviceResult(NamedTuple):
    o: np.ndarray
    softmax_lse: np.ndarray
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dbias: np.ndarray | None
    dsoftmax_offset: np.ndarray | None
    backend: int


def device_args(q, k, v, opts, rng_on_device=True):
    """(q, k, v device arrays, the keyword arguments of lib.attention_*, kept buffers)."""
    kw = att._options({n: x for n, x in opts.items() if not n.startswith("_")})
    args, keep = att._config(q, k, v, kw)
    held = []
    for name, host in zip(OPTIONAL, keep[3:]):
        if host is None or (name == "rng_state" and not rng_on_device):
            continue  # a host rng_state stays a host descriptor (allowed with device q)
        dev = DeviceArray.of(host)
        held.append(dev)
        args[name] = dev.desc()
    dq, dk, dv = (DeviceArray.of(x) for x in keep[:3])
    return (dq, dk, dv), args, held + list(keep)


def workspace(nbytes):
    return DeviceArray((max(int(nbytes), 1),), np.uint8) if nbytes else None


def device_run(q, k, v, d_o, opts, rng_on_device=True) -> DeviceResult:
    """Forward then backward on the device (o and lse of the device forward)."""
    (gq, gk, gv), args, _held = device_args(q, k, v, opts, rng_on_device)
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    o = DeviceArray((*q.shape[:-1], v.shape[-1]), q.dtype)
    fmt = att._options({"qkv_format": opts.get("qkv_format", "bshd")})
    lse = DeviceArray(att._lse_shape(q, fmt, q.shape[-2]), np.float32)
    backend = lib.attention_backend(gq.desc(), gk.desc(), gv.desc(), **args)
    ws = workspace(lib.attention_fwd_workspace_size(gq.desc(), gk.desc(), gv.desc(), **args))
    lib.attention_fwd(gq.desc(), gk.desc(), gv.desc(), o.desc(), lse.desc(), **args,
                      workspace=None if ws is None else ws.desc(), stream=core_device.stream())  # fmt: skip
    gdo = DeviceArray.of(d_o)
    dq, dk, dv = DeviceArray(q.shape, q.dtype), DeviceArray(k.shape, k.dtype), DeviceArray(v.shape, v.dtype)
    dbias = None if opts.get("attn_bias") is None else DeviceArray(np.shape(opts["attn_bias"]), q.dtype)
    learnable = opts.get("softmax_type") == "learnable"
    dalpha = DeviceArray((q.shape[-2],), np.float32) if learnable else None
    wsb = workspace(lib.attention_bwd_workspace_size(gq.desc(), gk.desc(), gv.desc(), **args))
    lib.attention_bwd(
        gq.desc(), gk.desc(), gv.desc(), o.desc(), gdo.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(),
        **args, dbias=None if dbias is None else dbias.desc(),
        dsoftmax_offset=None if dalpha is None else dalpha.desc(),
        workspace=None if wsb is None else wsb.desc(), stream=core_device.stream(),
    )  # fmt: skip
    return DeviceResult(
        o.numpy(),
        lse.numpy(),
        dq.numpy(),
        dk.numpy(),
        dv.numpy(),
        None if dbias is None else dbias.numpy(),
        None if dalpha is None else dalpha.numpy(),
        backend,
    )


def _both(name, got, cpu, want, err, u):
    """Within the oracle's bound of the oracle, and within twice it of the CPU backend."""
    device = core_device.current()
    assert_close(f"{device} {name} vs oracle", got, want, err, u)
    cpu = np.asarray(cpu, np.float64)
    bound = 4 * (np.asarray(err) + u * np.abs(want) + TINY_OUT.get(u, 2.0**-150))
    bad = ~(np.abs(np.asarray(got, np.float64) - cpu) <= bound)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{device} {name} vs cpu: {bad.sum()} of {bad.size} outside twice the oracle bound; "
                             f"first at {i}: {device} {got[i]!r}, cpu {cpu[i]!r}, bound {bound[i]!r}")  # fmt: skip


def check_device(q, k, v, d_o, opts, dtype, rng_on_device=True) -> DeviceResult:
    """The forward and backward on the test's device (CUDA: the core's fallback
    kernel) against the oracle's bounds and the NumPy API (the CPU backend)."""
    opts = {**opts, "_dtype": dtype}
    g = device_run(q, k, v, d_o, opts, rng_on_device)
    want = 2 if core_device.current() == "cuda" else 0  # (attention.BACKENDS: cuda_fallback, cpu)
    assert g.backend == want, f"expected backend {want}, the call ran backend {g.backend}"
    cf, cg = core_run(q, k, v, d_o, opts)
    orc = Oracle(q, k, v, d_o, opts)
    u = U_OUT[dtype]
    lse_inf = np.isneginf(orc.lse)
    assert np.array_equal(np.isneginf(g.softmax_lse), lse_inf), f"{core_device.current()} lse: -inf rows differ"
    _both("o", g.o, cf.o, orc.o, orc.e_o, u)
    z = lambda x: np.where(lse_inf, 0, x)  # noqa: E731
    _both("lse", z(g.softmax_lse), z(cf.softmax_lse), z(orc.lse), orc.e_lse, 0.0)
    _both("dq", g.dq, cg.dq, orc.dq, orc.e_dq, u)
    _both("dk", g.dk, cg.dk, orc.dk, orc.e_dk, u)
    _both("dv", g.dv, cg.dv, orc.dv, orc.e_dv, u)
    if orc.dbias is not None:
        _both("dbias", g.dbias, cg.dbias, orc.dbias, orc.e_db, u)
    if opts.get("softmax_type") == "learnable":
        _both("dsoftmax_offset", g.dsoftmax_offset, cg.dsoftmax_offset, orc.dalpha, orc.e_alpha, 2.0**-24)
    return g
