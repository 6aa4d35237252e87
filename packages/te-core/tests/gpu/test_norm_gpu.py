"""LayerNorm / RMSNorm on the CUDA backend.

- against the float64 oracle within the derived bounds of reference_norm, and against the
  CPU backend within the sum of both backends' bounds (summation orders differ, so the
  backends agree within rounding, not bit for bit);
- the fused FP8 output byte for byte equal to te_quantize_fp8 (CUDA) of the CUDA FP32 y;
- deterministic: two runs give the same bytes (dgamma/dbeta included);
- buffers that are not 16-byte aligned (shifted by whole elements: the API rejects
  addresses that are not a multiple of the element size) take the element-wise path and
  give the same bytes as aligned ones, whichever buffer is shifted.

Device buffers are torch.uint8 tensors holding the NumPy bytes; the descriptor carries the
core dtype code, so no torch FP8/BF16 dtype is involved.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from norm_inputs import FLOAT_DTYPES, NORM_SHAPES, grad_input, norm_input, weights  # noqa: E402

import transformer_engine.core as tc  # noqa: E402
from transformer_engine.core import reference_norm as nref  # noqa: E402
from transformer_engine.core.dtypes import te_dtype  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.norm]
lib = tc.lib

# Beyond the CPU shapes: long rows (8192; 16384 is the last register-resident forward
# shape, 10000 and 20000 take the looped kernels of the backward / both), rows whose
# length is no multiple of 8 (100, 1000: the scalar path), many rows.
GPU_SHAPES = NORM_SHAPES + [(64, 8192), (33, 100), (17, 1000), (3, 16384), (4, 10000), (3, 20000), (2048, 512)]
FP8 = {"e4m3": te_dtype("e4m3"), "e5m2": te_dtype("e5m2")}


@pytest.fixture(autouse=True)
def _require_cuda():
    if not (torch.cuda.is_available() and tc.built_with_cuda()):
        pytest.skip("needs a CUDA device and a te-core build with the CUDA backend")


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class Dev:
    """A device copy of a NumPy array (or an uninitialised one), `offset` bytes into a
    uint8 buffer. Keep it alive until the call using its descriptor has been enqueued."""

    def __init__(self, array=None, *, shape=None, dtype=None, code=None, offset=0):
        self.dtype = np.dtype(array.dtype if array is not None else dtype)
        self.shape = tuple(array.shape if array is not None else shape)
        self.code = int(te_dtype(self.dtype)) if code is None else int(code)
        self.offset = offset
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.buffer = torch.full((nbytes + offset,), 0xA5, dtype=torch.uint8, device="cuda")
        if array is not None and nbytes:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            self.buffer[offset:] = torch.from_numpy(raw.copy()).cuda()

    @property
    def desc(self):
        return lib.TensorDesc(
            self.buffer.data_ptr() + self.offset, self.code, list(self.shape), 1, self.buffer.device.index or 0
        )

    def numpy(self) -> np.ndarray:
        torch.cuda.synchronize()
        return self.buffer[self.offset :].cpu().numpy().view(self.dtype).reshape(self.shape)


def opt(d):
    return None if d is None else d.desc


def shifts(offset, offsets, names):
    """Element shifts per buffer name: `offset` for `names`, overridden by `offsets`."""
    return {**{n: offset for n in names}, **(offsets or {})}


def gpu_forward(layernorm, x, gamma, beta, eps, zcg, y_dtype, *, scale=None, amax=None, offset=0, offsets=None):
    """Runs the CUDA forward; y_dtype is a NumPy dtype or 'e4m3'/'e5m2'. NumPy results.
    amax: the y_amax start value (FP8 y: 0 when None; high-precision y: none passed when None).
    x and y start `offset` ELEMENTS into their buffers; `offsets` maps any of x, gamma,
    beta, y to its own shift in elements."""
    fp8 = isinstance(y_dtype, str)
    y_np = np.dtype(np.uint8) if fp8 else np.dtype(y_dtype)
    sh = shifts(offset, offsets, ("x", "y"))
    dx_ = Dev(x, offset=sh.get("x", 0) * x.dtype.itemsize)
    dg = Dev(gamma, offset=sh.get("gamma", 0) * gamma.dtype.itemsize)
    db = Dev(beta, offset=sh.get("beta", 0) * beta.dtype.itemsize)
    y = Dev(shape=x.shape, dtype=y_np, code=FP8[y_dtype] if fp8 else None, offset=sh.get("y", 0) * y_np.itemsize)
    rows = x.shape[:-1]
    mu, rsigma = Dev(shape=rows, dtype=np.float32), Dev(shape=rows, dtype=np.float32)
    s = Dev(np.array(scale, np.float32)) if fp8 else None
    si = Dev(np.array(0.0, np.float32)) if fp8 else None
    am = Dev(np.array(0.0 if amax is None else amax, np.float32)) if fp8 or amax is not None else None
    if layernorm:
        lib.layernorm_fwd(
            dx_.desc, dg.desc, db.desc, eps, zcg, y.desc, opt(s), opt(si), opt(am), mu.desc, rsigma.desc, _stream()
        )
    else:
        lib.rmsnorm_fwd(dx_.desc, dg.desc, eps, zcg, y.desc, opt(s), opt(si), opt(am), rsigma.desc, _stream())
    out = {"y": y.numpy(), "rsigma": rsigma.numpy(), "mu": mu.numpy() if layernorm else None}
    if fp8:
        out.update(scale_inv=si.numpy()[()])
    if am is not None:
        out.update(amax=am.numpy()[()])
    return out


def gpu_backward(layernorm, dz, x, mu, rsigma, gamma, zcg, *, offset=0, offsets=None):
    """Runs the CUDA backward; dz, x and dx start `offset` elements into their buffers,
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
    assert nbytes > 0  # the CUDA backward always reduces through the workspace
    ws = Dev(shape=(nbytes,), dtype=np.uint8)
    if layernorm:
        lib.layernorm_bwd(
            ddz.desc, dx_in.desc, dmu.desc, drs.desc, dg.desc, zcg, dx.desc, dgamma.desc, dbeta.desc, ws.desc, _stream()
        )
    else:
        lib.rmsnorm_bwd(ddz.desc, dx_in.desc, drs.desc, dg.desc, zcg, dx.desc, dgamma.desc, ws.desc, _stream())
    return dx.numpy(), dgamma.numpy(), dbeta.numpy() if layernorm else None


def oracle_forward(layernorm, x, gamma, beta, eps, zcg, y_dtype):
    if layernorm:
        y, mu, rsigma = nref.layernorm_fwd(x, gamma, beta, eps, zcg)
    else:
        (y, rsigma), mu = nref.rmsnorm_fwd(x, gamma, eps, zcg), None
    bounds = nref.forward_bounds(layernorm, x, gamma, beta, eps, zcg, y, mu, rsigma, y_dtype)
    return (y, mu, rsigma), bounds


def cpu_forward(layernorm, x, gamma, beta, eps, zcg, y_dtype):
    if layernorm:
        return tc.layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma=zcg, out_dtype=y_dtype)
    return tc.rmsnorm_fwd(x, gamma, eps, zero_centered_gamma=zcg, out_dtype=y_dtype)


def same_bytes(a, b, what):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.shape == b.shape, what
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=what)


# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize(
    "combo",
    list(itertools.product(FLOAT_DTYPES, FLOAT_DTYPES, FLOAT_DTYPES)),
    ids=lambda c: "-".join(np.dtype(d).name for d in c),
)
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_forward_vs_oracle_and_cpu(rng, layernorm, combo, shape):
    x_dtype, w_dtype, y_dtype = combo
    zcg = bool(rng.integers(2))
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], w_dtype, zero_centered=zcg)
    got = gpu_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype)
    (y, mu, rsigma), (by, bmu, brs) = oracle_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype)
    nref.assert_within(got["y"], y, by, "cuda y vs oracle")
    nref.assert_within(got["rsigma"], rsigma, brs, "cuda rsigma vs oracle")
    cpu = cpu_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype)
    # Both backends are within the bound of the oracle, so within twice it of each other.
    nref.assert_within(got["y"], cpu.y.astype(np.float64), 2 * by, "cuda y vs cpu")
    nref.assert_within(got["rsigma"], cpu.rsigma, 2 * brs, "cuda rsigma vs cpu")
    if layernorm:
        nref.assert_within(got["mu"], mu, bmu, "cuda mu vs oracle")
        nref.assert_within(got["mu"], cpu.mu, 2 * bmu, "cuda mu vs cpu")


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
# offset: x and y shifted by that many elements (2: no 16-byte alignment for any x type).
@pytest.mark.parametrize("shape,offset", [(s, 0) for s in GPU_SHAPES] + [((40, 256), 2), ((9, 1000), 4)])
def test_fused_fp8_equals_quantize_of_cuda_fp32_output(rng, layernorm, x_dtype, fmt, shape, offset):
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], np.dtype(np.float32))
    zcg = bool(rng.integers(2))
    scale = np.float32(rng.choice([1.0, 37.5, 300.0, 2.0**-3]))
    amax0 = np.float32(rng.choice([0.0, 1e4]))
    fused = gpu_forward(layernorm, x, gamma, beta, 1e-5, zcg, fmt, scale=scale, amax=amax0, offset=offset)
    y32 = gpu_forward(layernorm, x, gamma, beta, 1e-5, zcg, np.float32, offset=offset)["y"]
    # te_quantize_fp8 on the device copy of the CUDA FP32 y.
    dy, q = Dev(y32), Dev(shape=shape, dtype=np.uint8, code=FP8[fmt])
    ds, dsi, dam = Dev(np.array(scale)), Dev(np.array(0.0, np.float32)), Dev(np.array(amax0))
    lib.quantize_fp8(dy.desc, ds.desc, q.desc, None, dsi.desc, dam.desc, _stream())
    same_bytes(fused["y"], q.numpy(), "fused FP8 y vs te_quantize_fp8(CUDA FP32 y)")
    assert fused["amax"] == dam.numpy()[()]
    assert fused["scale_inv"] == dsi.numpy()[()] == np.float32(1) / scale


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("y_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,offset", [(s, 0) for s in GPU_SHAPES] + [((40, 256), 2), ((9, 1000), 4)])
def test_high_precision_y_amax_is_that_of_the_stored_y(rng, layernorm, x_dtype, y_dtype, shape, offset):
    """y_amax with a FP32/BF16/FP16 y: max(start, max|y|) of the y the kernel stored (NaN
    rows skipped), exactly; the y bytes are those of the same call without y_amax."""
    x = norm_input(rng, shape, x_dtype)
    gamma, beta = weights(rng, shape[-1], np.dtype(np.float32))
    zcg = bool(rng.integers(2))
    amax0 = np.float32(rng.choice([0.0, 0.5, 1e4]))
    fused = gpu_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype, amax=amax0, offset=offset)
    plain = gpu_forward(layernorm, x, gamma, beta, 1e-5, zcg, y_dtype, offset=offset)
    same_bytes(fused["y"], plain["y"], "y with and without y_amax")
    stored = np.abs(fused["y"].astype(np.float32))
    want = max(amax0, np.float32(np.max(stored, initial=0.0, where=~np.isnan(stored))))
    assert fused["amax"] == want, (fused["amax"], want)


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize(
    "x_dtype,w_dtype", list(itertools.product(FLOAT_DTYPES, FLOAT_DTYPES)), ids=lambda d: np.dtype(d).name
)
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_backward_vs_oracle_and_cpu(rng, layernorm, x_dtype, w_dtype, shape):
    zcg = bool(rng.integers(2))
    x = norm_input(rng, shape, x_dtype, specials=False)
    gamma, beta = weights(rng, shape[-1], w_dtype, zero_centered=zcg)
    dz = grad_input(rng, shape, x_dtype)
    fwd = cpu_forward(layernorm, x, gamma, beta, 1e-5, zcg, np.float32)  # the saved statistics
    dx, dgamma, dbeta = gpu_backward(layernorm, dz, x, fwd.mu, fwd.rsigma, gamma, zcg)
    if layernorm:
        e_dx, e_dg, e_db = nref.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma, zcg)
        c_dx, c_dg, c_db = tc.layernorm_bwd(dz, x, fwd.mu, fwd.rsigma, gamma, zero_centered_gamma=zcg)
    else:
        (e_dx, e_dg), e_db = nref.rmsnorm_bwd(dz, x, fwd.rsigma, gamma, zcg), None
        (c_dx, c_dg), c_db = tc.rmsnorm_bwd(dz, x, fwd.rsigma, gamma, zero_centered_gamma=zcg), None
    b_dx, b_dg, b_db = nref.backward_bounds(
        layernorm, dz, x, fwd.mu, fwd.rsigma, gamma, zcg, e_dx, x.dtype, gamma.dtype
    )
    assert dx.dtype == x.dtype and dgamma.dtype == gamma.dtype
    nref.assert_within(dx, e_dx, b_dx, "cuda dx vs oracle")
    nref.assert_within(dgamma, e_dg, b_dg, "cuda dgamma vs oracle")
    nref.assert_within(dx, c_dx.astype(np.float64), 2 * b_dx, "cuda dx vs cpu")
    nref.assert_within(dgamma, c_dg.astype(np.float64), 2 * b_dg, "cuda dgamma vs cpu")
    if layernorm:
        nref.assert_within(dbeta, e_db, b_db, "cuda dbeta vs oracle")
        nref.assert_within(dbeta, c_db.astype(np.float64), 2 * b_db, "cuda dbeta vs cpu")


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape", [(4096, 1024), (1000, 4096), (300, 8192), (2, 20000), (77, 1000)])
def test_deterministic_run_to_run(rng, layernorm, shape):
    bf16 = FLOAT_DTYPES[1]
    x = norm_input(rng, shape, bf16, specials=False)
    gamma, beta = weights(rng, shape[-1], bf16)
    dz = grad_input(rng, shape, bf16)
    runs = []
    for _ in range(2):
        f = gpu_forward(layernorm, x, gamma, beta, 1e-5, False, bf16)
        b = gpu_backward(layernorm, dz, x, f["mu"], f["rsigma"], gamma, False)
        runs.append([f["y"], f["rsigma"], *[a for a in b if a is not None]])
    for first, second in zip(*runs):
        same_bytes(first, second, "second run")


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_unaligned_buffers_give_the_aligned_bytes(rng, layernorm, x_dtype):
    """The scalar path (misaligned rows) adds in the same order as the vector path."""
    shape = (37, 512)
    x = norm_input(rng, shape, x_dtype, specials=False)
    gamma, beta = weights(rng, 512, x_dtype)
    dz = grad_input(rng, shape, x_dtype)
    aligned = gpu_forward(layernorm, x, gamma, beta, 1e-5, True, x_dtype)
    shifted = gpu_forward(layernorm, x, gamma, beta, 1e-5, True, x_dtype, offset=1)
    for key in ("y", "rsigma"):
        same_bytes(aligned[key], shifted[key], key)
    mu = aligned["mu"] if layernorm else None
    for a, b in zip(
        gpu_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, True),
        gpu_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, True, offset=1),
    ):
        if a is not None:
            same_bytes(a, b, "backward")


F32, BF16, F16 = FLOAT_DTYPES


@pytest.mark.parametrize("layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize(
    "x_dtype,y_dtype",
    [(BF16, BF16), (BF16, "e4m3"), (F32, F32), (F32, "e5m2"), (F16, F32)],
    ids=lambda d: d if isinstance(d, str) else np.dtype(d).name,
)
@pytest.mark.parametrize("shape", [(37, 512), (300, 4096), (5, 8192)])
def test_each_misaligned_buffer_gives_the_aligned_bytes(rng, layernorm, x_dtype, y_dtype, shape):
    """Every pointer's alignment is checked before a vector path is taken: shifting any one
    buffer by one element (x, y, gamma, beta; dz, x, dx, gamma) must neither fault nor
    change a byte. The shapes take the one-warp and multi-warp row kernels."""
    x = norm_input(rng, shape, x_dtype, specials=False)
    gamma, beta = weights(rng, shape[-1], BF16)
    dz = grad_input(rng, shape, x_dtype)
    # (a high-precision y with y_amax: the stored y's amax must not depend on the path either)
    kw = dict(scale=np.float32(8.0)) if isinstance(y_dtype, str) else dict(amax=np.float32(0.0))
    aligned = gpu_forward(layernorm, x, gamma, beta, 1e-5, False, y_dtype, **kw)
    for name in ("x", "y", "gamma", "beta"):
        shifted = gpu_forward(layernorm, x, gamma, beta, 1e-5, False, y_dtype, offsets={name: 1}, **kw)
        for key in ("y", "mu", "rsigma", "amax", "scale_inv"):
            if aligned.get(key) is not None:
                same_bytes(aligned[key], shifted[key], f"forward, {name} shifted: {key}")
    mu = aligned["mu"] if layernorm else None
    ref = gpu_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, False)
    for name in ("dz", "x", "dx", "gamma"):
        got = gpu_backward(layernorm, dz, x, mu, aligned["rsigma"], gamma, False, offsets={name: 1})
        for a, b in zip(ref, got):
            if a is not None:
                same_bytes(a, b, f"backward, {name} shifted")


def test_misaligned_element_address_is_rejected(rng):
    """An FP32 buffer 2 bytes off its element alignment is refused before any kernel runs."""
    x = norm_input(rng, (4, 64), np.float32, specials=False)
    gamma, beta = weights(rng, 64, np.dtype(np.float32))
    bad = Dev(x, offset=2)
    args = [Dev(gamma), Dev(beta)]
    y = Dev(shape=x.shape, dtype=np.float32)
    with pytest.raises(
        ValueError,
        match=r"argument 'x' must be aligned to its element size \(4 bytes "
        r"for float32\), got an address 2 bytes past a multiple of 4",
    ):
        lib.layernorm_fwd(
            bad.desc, args[0].desc, args[1].desc, 1e-5, False, y.desc, None, None, None, None, None, _stream()
        )
    torch.cuda.synchronize()  # the context is still healthy


def test_empty_batch_and_workspace_checks(rng):
    gamma, beta = weights(rng, 64, np.dtype(np.float32))
    x = np.zeros((0, 64), np.float32)
    out = gpu_forward(True, x, gamma, beta, 1e-5, False, "e4m3", scale=4.0, amax=3.0)
    assert out["scale_inv"] == 0.25 and out["amax"] == 3.0
    _, dgamma, dbeta = gpu_backward(True, x, x, np.zeros(0), np.zeros(0), gamma, False)
    assert not dgamma.any() and not dbeta.any()

    x = rng.standard_normal((8, 64)).astype(np.float32)
    dxin = Dev(x)
    need = lib.layernorm_bwd_workspace_size(dxin.desc)
    small = Dev(shape=(need - 1,), dtype=np.uint8)
    args = [Dev(x), dxin, Dev(np.zeros(8, np.float32)), Dev(np.ones(8, np.float32)), Dev(gamma)]
    outs = [Dev(shape=x.shape, dtype=np.float32), Dev(gamma), Dev(gamma)]
    with pytest.raises(ValueError, match=f"argument 'workspace' must hold at least {need} bytes"):
        lib.layernorm_bwd(*[a.desc for a in args], False, *[o.desc for o in outs], small.desc, _stream())
    with pytest.raises(ValueError, match="argument 'workspace' is required"):
        lib.layernorm_bwd(*[a.desc for a in args], False, *[o.desc for o in outs], None, _stream())
