"""The eager fast paths against the public ops they shortcut, and the caches
they rely on (descriptor caches, workspaces kept alive for CUDA graphs).

The fast paths make the same te-core calls with descriptors prepared once, so
their bytes and scales must equal the public kernels' exactly; the amax and
scale a current-scaling quantizer records are checked against float64 torch.
"""

from __future__ import annotations

import pytest
import torch
from pt_helpers import hostile

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels import _common

pytest_plugins = ["pt_fixtures"]
pytestmark = [pytest.mark.usefixtures("te_state"), pytest.mark.cast]

E4M3, E5M2 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2
FP8_MAX = {E4M3: 448.0, E5M2: 57344.0}
USAGES = [(True, False), (False, True), (True, True)]


def _assert_same(got, expected):
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if g is not None:
            assert torch.equal(g, e)


@pytest.mark.parametrize("rowwise,columnwise", USAGES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_delayed_quantizer_matches_public_op(device, rowwise, columnwise, dtype):
    x = hostile((3, 16, 32), dtype, device)
    quantizer = te.Float8Quantizer(torch.tensor([2.5], device=device), torch.zeros(1, device=device), E4M3)
    amax = torch.zeros(1, device=device)
    got = quantizer.quantize_parts(x, rowwise, columnwise)
    expected = kernels.quantize_fp8(x, quantizer.scale, amax, int(E4M3), rowwise, columnwise)
    _assert_same(got, expected)
    assert torch.equal(quantizer.amax, amax)  # the fast path accumulated into the quantizer's amax
    # A new scale tensor on the quantizer is picked up (the cached descriptor is refreshed).
    quantizer.scale = torch.tensor([0.5], device=device)
    got = quantizer.quantize_parts(x, rowwise, columnwise)
    _assert_same(got, kernels.quantize_fp8(x, quantizer.scale, None, int(E4M3), rowwise, columnwise))


@pytest.mark.parametrize("rowwise,columnwise", USAGES)
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2])
@pytest.mark.parametrize("pow2", [False, True])
def test_current_scaling_quantizer_matches_public_op(device, rowwise, columnwise, fp8_dtype, pow2):
    x = (3 * torch.randn(32, 48, device=device)).to(torch.bfloat16)  # finite: a finite amax to compare
    quantizer = te.Float8CurrentScalingQuantizer(fp8_dtype, device, force_pow_2_scales=pow2)
    row, col, scale_inv = quantizer.quantize_parts(x, rowwise, columnwise)
    e_row, e_col, stats = kernels.quantize_fp8_current_scaling(x, int(fp8_dtype), rowwise, columnwise, pow2)
    _assert_same((row, col, scale_inv), (e_row, e_col, stats[1:2]))
    # The quantizer recorded this tensor's amax and scale (float64 reference for the amax).
    amax = x.double().abs().max()
    assert quantizer.amax.item() == amax.item()
    assert torch.equal(quantizer.scale, stats[0:1])
    if not pow2:
        assert quantizer.scale.item() == pytest.approx(FP8_MAX[fp8_dtype] / amax.item(), rel=1e-6)
    # The scale_inv the GEMMs read is its own 16-byte aligned allocation.
    assert scale_inv.data_ptr() % 16 == 0


def test_current_scaling_quantizer_on_another_device_takes_the_public_path():
    """A quantizer built for the CPU (the default) quantizing a tensor elsewhere
    must not hand the core descriptors of the wrong device; here the tensor is
    on the CPU too, so this checks the device bookkeeping of the cache."""
    quantizer = te.Float8CurrentScalingQuantizer(E4M3)
    x = hostile((16, 16), torch.float32, "cpu")
    quantizer.quantize_parts(x, True, False)
    assert quantizer._state_device == x.get_device() == -1


def test_delayed_state_update_descriptors_follow_replaced_tensors():
    layer = te.Linear(16, 16, device="cpu")
    x = torch.randn(16, 16, requires_grad=True)
    with te.autocast(recipe=recipe.DelayedScaling()):
        layer(x).sum().backward()
    state = layer.fp8_meta["scaling_fwd"]
    first = state.update_descs()
    assert state.update_descs() is first  # cached
    state.scale = state.scale.clone()
    again = state.update_descs()
    assert again is not first and again[1].data == state.scale.data_ptr()


def test_workspace_is_cached_and_outgrown_buffers_stay_alive():
    like = torch.empty(1)
    stream = 12345  # a key no other test uses
    small = kernels._common.workspace(100, like, stream)
    assert kernels._common.workspace(100, like, stream) is small  # same descriptor, no allocation
    retired = len(_common._RETIRED)
    big = kernels._common.workspace(3 << 20, like, stream)
    assert big.data != small.data and big.shape[0] >= 3 << 20
    # The old buffer is kept (a captured CUDA graph may still point at it).
    assert len(_common._RETIRED) == retired + 1 and _common._RETIRED[-1].data_ptr() == small.data
    del _common._WORKSPACES[(like.get_device(), stream)]
    _common._RETIRED.pop()
