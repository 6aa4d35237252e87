"""The norm tests on raw device buffers (the `device` fixture): the forward and
backward on the test's device, the oracle with its bounds, and the NumPy API
(the CPU backend) to compare with."""

from __future__ import annotations

import core_device
import numpy as np

import transformer_engine.core as tc
from transformer_engine.core import reference_norm as nref
from transformer_engine.core.dtypes import te_dtype

lib = tc.lib
FP8_CODES = {"e4m3": te_dtype("e4m3"), "e5m2": te_dtype("e5m2")}


class Dev:
    """A copy of a NumPy array (or an uninitialised one, 0xA5 bytes) on the test's
    device, `offset` bytes into its buffer. Keep it alive until the call using its
    descriptor has been enqueued."""

    def __init__(self, array=None, *, shape=None, dtype=None, code=None, offset=0):
        self.dtype = np.dtype(array.dtype if array is not None else dtype)
        self.shape = tuple(array.shape if array is not None else shape)
        self.code = int(te_dtype(self.dtype)) if code is None else int(code)
        self.offset = offset
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.buffer = core_device.Buffer(self.nbytes + offset)
        if array is not None and self.nbytes:
            self.buffer.write(offset, np.ascontiguousarray(array))

    @property
    def desc(self):
        return self.buffer.desc(self.offset, self.code, self.shape)

    def numpy(self) -> np.ndarray:
        self.buffer.sync()
        return self.buffer.read(self.offset, self.nbytes).view(self.dtype).reshape(self.shape)


def opt(d):
    return None if d is None else d.desc


def shifts(offset, offsets, names):
    """Element shifts per buffer name: `offset` for `names`, overridden by `offsets`."""
    return {**{n: offset for n in names}, **(offsets or {})}


def device_forward(layernorm, x, gamma, beta, eps, zcg, y_dtype, *, scale=None, amax=None, offset=0, offsets=None):
    """Runs the forward on the test's device; y_dtype is a NumPy dtype or 'e4m3'/'e5m2'. NumPy results.
    amax: the y_amax start value (FP8 y: 0 when None; high-precision y: none passed when None).
    x and y start `offset` ELEMENTS into their buffers; `offsets` maps any of x, gamma,
    beta, y to its own shift in elements."""
    fp8 = isinstance(y_dtype, str)
    y_np = np.dtype(np.uint8) if fp8 else np.dtype(y_dtype)
    sh = shifts(offset, offsets, ("x", "y"))
    dx_ = Dev(x, offset=sh.get("x", 0) * x.dtype.itemsize)
    dg = Dev(gamma, offset=sh.get("gamma", 0) * gamma.dtype.itemsize)
    db = Dev(beta, offset=sh.get("beta", 0) * beta.dtype.itemsize)
    y = Dev(shape=x.shape, dtype=y_np, code=FP8_CODES[y_dtype] if fp8 else None, offset=sh.get("y", 0) * y_np.itemsize)
    rows = x.shape[:-1]
    mu, rsigma = Dev(shape=rows, dtype=np.float32), Dev(shape=rows, dtype=np.float32)
    s = Dev(np.array(scale, np.float32)) if fp8 else None
    si = Dev(np.array(0.0, np.float32)) if fp8 else None
    am = Dev(np.array(0.0 if amax is None else amax, np.float32)) if fp8 or amax is not None else None
    if layernorm:
        lib.layernorm_fwd(
            dx_.desc,
            dg.desc,
            db.desc,
            eps,
            zcg,
            y.desc,
            opt(s),
            opt(si),
            opt(am),
            mu.desc,
            rsigma.desc,
            core_device.stream(),
        )
    else:
        lib.rmsnorm_fwd(
            dx_.desc, dg.desc, eps, zcg, y.desc, opt(s), opt(si), opt(am), rsigma.desc, core_device.stream()
        )
    out = {"y": y.numpy(), "rsigma": rsigma.numpy(), "mu": mu.numpy() if layernorm else None}
    if fp8:
        out.update(scale_inv=si.numpy()[()])
    if am is not None:
        out.update(amax=am.numpy()[()])
    return out


def device_backward(layernorm, dz, x, mu, rsigma, gamma, zcg, *, offset=0, offsets=None):
    """Runs the backward on the test's device; dz, x and dx start `offset` elements into their buffers,
    `offsets` maps any of dz, x, dx, gamma to its own shift in elements."""
    sh = shifts(offset, offsets, ("dz", "x", "dx"))
    item = x.dtype.itemsize
    ddz, dx_in = Dev(dz, offset=sh.get("dz", 0) * item), Dev(x, offset=sh.get("x", 0) * item)
    dg = Dev(gamma, offset=sh.get("gamma", 0) * gamma.dtype.itemsize)
    dmu = Dev(np.asarray(mu, np.float32)) if layernorm else None
    drs = Dev(np.asarray(rsigma, np.float32))
    dx = Dev(shape=x.shape, dtype=x.dtype, offset=sh.get("dx", 0) * item)
    dgamma, dbeta = Dev(shape=gamma.shape, dtype=gamma.dtype), Dev(shape=gamma.shape, dtype=gamma.dtype)
    query = lib.layernorm_bwd_workspace_size if layernorm else lib.rmsnorm_bwd_workspace_size
    nbytes = query(dx_in.desc)
    # (the CUDA backward always reduces through the workspace; the CPU one needs none)
    assert (nbytes > 0) == (core_device.current() == "cuda")
    ws = Dev(shape=(nbytes,), dtype=np.uint8)
    if layernorm:
        lib.layernorm_bwd(
            ddz.desc,
            dx_in.desc,
            dmu.desc,
            drs.desc,
            dg.desc,
            zcg,
            dx.desc,
            dgamma.desc,
            dbeta.desc,
            ws.desc,
            core_device.stream(),
        )
    else:
        lib.rmsnorm_bwd(
            ddz.desc, dx_in.desc, drs.desc, dg.desc, zcg, dx.desc, dgamma.desc, ws.desc, core_device.stream()
        )
    return dx.numpy(), dgamma.numpy(), dbeta.numpy() if layernorm else None


def oracle_forward(layernorm, x, gamma, beta, eps, zcg, y_dtype):
    if layernorm:
        y, mu, rsigma = nref.layernorm_fwd(x, gamma, beta, eps, zcg)
    else:
        (y, rsigma), mu = nref.rmsnorm_fwd(x, gamma, eps, zcg), None
    bounds = nref.forward_bounds(layernorm, x, gamma, beta, eps, zcg, y, mu, rsigma, y_dtype)
    return (y, mu, rsigma), bounds


def numpy_api_forward(layernorm, x, gamma, beta, eps, zcg, y_dtype):
    if layernorm:
        return tc.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma=zcg, out_dtype=y_dtype)
    return tc.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma=zcg, out_dtype=y_dtype)


def same_bytes(a, b, what):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.shape == b.shape, what
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=what)
