"""Sharding over a device mesh: transformer_engine.jax.sharding's names and rules (in this
process, one device), and the ops and Flax modules partitioned over 8 virtual CPU devices
(jax_sharding_cases.py, run once in a subprocess: XLA_FLAGS must be set before JAX starts).

For each op / module and recipe (none, DelayedScaling, Float8CurrentScaling) the sharded
forward and backward equal the single-device ones: y bit for bit where no sum is split
across devices (column parallel, data parallel, sequence-parallel norms; FP8 casts use the
mesh-wide amax, so the FP8 bytes are the single-device ones), within TOL of the largest
magnitude where a sum is (row parallel, dX / dW / dgamma all-reduced: FP32 sums reordered,
about 1e-7 measured); the delayed-scaling state bit for bit. The compiled HLO holds the
collectives of each layout and never an all-gather of a full weight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax_sharding_cases import CASES

import transformer_engine.jax as te_jax
from transformer_engine.jax import sharding

pytest.importorskip("flax")
TOL = 1e-5  # relative to an output's largest magnitude (FP32 sums split over <= 4 devices)
TOL_BF16 = 2.0**-6  # the same with bfloat16 partial sums (each rounded once, 2^-9, before the sum)
FULL_WEIGHTS = {"[64,128]", "[128,64]", "[64,2,128]"}  # the kernels of the cases, unsharded
_FAMILY = {
    "dense": [pytest.mark.gemm],
    "layernorm_dense": [pytest.mark.gemm, pytest.mark.norm],
    "layernorm_mlp": [pytest.mark.gemm, pytest.mark.norm, pytest.mark.activation],
    "layernorm": [pytest.mark.norm],
    "activation": [pytest.mark.activation],
    "softmax": [pytest.mark.softmax],
    "attention": [pytest.mark.attention],
}


def _marks(name: str):
    op, recipe = name.split("-")[0], name.split("-")[-1]
    marks = [pytest.mark.module] if op.startswith("flax_") else list(_FAMILY[op])
    return marks + ([pytest.mark.recipe] if recipe != "none" else [])


@pytest.fixture(scope="module")
def results():
    script = os.path.join(os.path.dirname(__file__), "jax_sharding_cases.py")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout)


def _gathers(result, dims) -> list:
    """The all-gathers whose result has one of `dims` ("[64,128]": any element type)."""
    gathered = lambda c: {s[s.index("[") :] for s in c["shapes"]}  # noqa: E731
    return [c for c in result["collectives"] if c["kind"] == "all-gather" and gathered(c) & dims]


def _has(result, kind, shape=None, group=None) -> bool:
    return any(
        c["kind"] == kind and (shape is None or shape in c["shapes"]) and (group is None or c["group"] == group)
        for c in result["collectives"]
    )


# What each layout's HLO must hold (f32 shapes are per device; meshes dp2 x tp4, or dp2 x fsdp2 x tp2).
EXPECTED = {
    "dense-col": [("all-reduce", "f32[2,16,64]", 4), ("all-reduce", "f32[64,32]", 2)],  # dX over tp, dW over dp
    "dense-row": [("all-reduce", "f32[2,16,64]", 4)],  # Y over tp
    "dense-col_sp": [("all-gather", "f32[2,16,64]", 4), ("reduce-scatter", "f32[2,4,64]", 4)],
    "dense-row_sp": [("reduce-scatter", "f32[2,4,64]", 4), ("all-gather", "f32[2,16,64]", 4)],
    "dense-fsdp": [("all-gather", "f32[64,64]", 2), ("reduce-scatter", "f32[32,64]", 2)],  # W gathered, dW scattered
    "dense-fsdpw": [("all-gather", "f32[64,64]", 2)],  # rows replicated: dW is sliced, not reduced
    "layernorm_dense-sp_fsdp": [("all-gather", "f32[64,64]", 2), ("reduce-scatter", "f32[1,8,64]", 2)],
    "layernorm_mlp-sp_fsdp": [("all-gather", "f32[64,2,64]", 2), ("reduce-scatter", "f32[1,8,64]", 2)],
    # (XLA's CPU backend runs 16-bit collectives in FP32: the shapes read f32 there too.)
    "layernorm_mlp-bf16": [("all-gather", "f32[64,2,64]", 2), ("reduce-scatter", "f32[1,8,64]", 2)],
    "flax_DenseGeneral": [("all-reduce", "f32[2,16,64]", 4)],
    # q / kv column parallel (dX summed over tp), out row parallel (Y summed over tp)
    "flax_MultiHeadAttention": [("all-reduce", "f32[2,16,64]", 4)],
    "flax_TransformerLayer": [("all-reduce", "f32[2,16,64]", 4)],
    "flax_LayerNormMLP": [("all-reduce", "f32[2,16,64]", 4)],
}
# Sums split across devices in the forward: y within TOL instead of bit for bit.
SPLIT_FORWARD = {
    "dense-row",
    "dense-row_sp",
    "layernorm_mlp-sp_fsdp",
    "layernorm_mlp-bf16",
    "flax_LayerNormMLP",
    "flax_MultiHeadAttention",
    "flax_TransformerLayer",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in CASES])
def test_sharded_equals_single_device(results, name):
    result = results[name]
    assert "error" not in result, result.get("error")
    layout, recipe = name.rsplit("-", 1)
    assert max(result["rel"]) <= (TOL_BF16 if "bf16" in layout else TOL), result["rel"]
    assert result.get("y_dtype", "float32") == ("bfloat16" if "bf16" in layout else "float32")
    if layout not in SPLIT_FORWARD:
        assert result["y_exact"], "no sum is split in this forward: y must be bit-identical"
    assert all(result["state_exact"]), "every shard must compute the single-device FP8 state"
    if recipe == "delayed":
        assert result["state_exact"], "a delayed-scaling case has quantizer state"


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in CASES])
def test_compiled_collectives(results, name):
    result = results[name]
    assert "error" not in result, result.get("error")
    layout, recipe = name.rsplit("-", 1)
    for kind, shape, group in EXPECTED.get(layout, []):
        assert _has(result, kind, shape, group), (kind, shape, group, result["collectives"])
    weights = FULL_WEIGHTS | set(result.get("weights", ()))  # (a Flax case lists its kernels)
    assert not _gathers(result, weights), "no device may gather a whole weight"
    if layout in ("dense-col", "dense-row", "flax_DenseGeneral", "activation-tp", "layernorm-sp"):
        assert not _has(result, "all-gather"), "pure tensor / data parallelism gathers nothing"
    if layout == "dense-fsdpw":
        assert not _has(result, "reduce-scatter"), "replicated rows: each shard keeps its block of dW"
    if layout.startswith("softmax") or layout in ("attention-causal_gqa", "attention-thd"):
        assert result["collectives"] == [], "rows and heads are independent: no collective"
    if layout == "attention-padding_bias":  # the bias is shared by the batch rows: its gradient summed over dp
        assert _has(result, "all-reduce", "f32[1,2,16,16]", 2), result["collectives"]
    if layout == "attention-learnable":  # the offset is shared by the batch rows
        assert _has(result, "all-reduce", "f32[1,2,1,1]", 2), result["collectives"]
    amax = _has(result, "all-reduce", "f32[1]", 8)  # the amax max-reduction over the whole mesh
    # (block formats' scales come from each block alone: nothing to reduce)
    assert amax == (recipe not in ("none", "mxfp8", "fp8_block")), result["collectives"]


# The block each layout's main kernel runs on (its first operand, per device): the kernels are
# partitioned, not run on gathered operands. x is [4, 16, 64] (rows 64) unless said otherwise.
BLOCKS = {
    "dense-col": ("te_jax_gemm", "32,64"),  # rows / dp
    "dense-row": ("te_jax_gemm", "32,32"),  # x [4, 16, 128]: rows / dp, K / tp
    "dense-fsdp": ("te_jax_gemm", "16,64"),  # rows / (dp fsdp)
    "layernorm_dense-sp_fsdp": ("te_jax_layernorm_fwd", "8,64"),  # batch / (dp fsdp), sequence / tp
    "layernorm_mlp-sp_fsdp": ("te_jax_rmsnorm_fwd", "8,64"),
    "layernorm_mlp-bf16": ("te_jax_rmsnorm_fwd", "8,64"),
    "layernorm-sp": ("te_jax_layernorm_fwd", "8,64"),
    "activation-tp": ("te_jax_activation_fwd", "32,64"),  # [4, 16, 2, 128]: rows / dp, K / tp
    "softmax-masked": ("te_jax_softmax_fwd", "2,2,16,16"),  # [4, 8, 16, 16]: batch / dp, heads / tp
    "softmax-causal": ("te_jax_softmax_fwd", "4,16,16"),
    "attention-causal_gqa": ("te_jax_attention_fwd", "2,16,2,16"),  # q [4, 16, 8, 16]
    "attention-padding_bias": ("te_jax_attention_fwd", "2,16,2,16"),
    "attention-learnable": ("te_jax_attention_fwd", "2,16,2,16"),
    "attention-thd": ("te_jax_attention_fwd", "64,2,16"),  # thd: heads / tp only
    "flax_TransformerLayer": ("te_jax_attention_fwd", "2,16,1,16"),
    "flax_MultiHeadAttention": ("te_jax_attention_fwd", "2,16,2,16"),  # 8 heads / tp
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in CASES if n.rsplit("-", 1)[0] in BLOCKS])
def test_kernels_run_on_local_blocks(results, name):
    target, block = BLOCKS[name.rsplit("-", 1)[0]]
    if name.endswith(("-mxfp8", "-fp8_block", "-nvfp4")) and target == "te_jax_gemm":
        target = "te_jax_gemm_block"  # (the block-scaled GEMM, on the same local blocks)
        if name.endswith("-nvfp4"):  # (NVFP4 data is packed, two elements per byte)
            *lead, last = block.split(",")
            block = ",".join([*lead, str(int(last) // 2)])
    shapes = {shape.split("[")[1].rstrip("]") for t, shape in results[name]["ffi_calls"] if t == target}
    assert block in shapes, (target, block, shapes)


@pytest.mark.gemm
def test_unsupported_layouts_raise_clearly(results):
    errors = results["_errors"]
    assert errors["cp"].startswith("NotImplementedError") and "MeshResource.cp_resource='tp'" in errors["cp"]
    assert "context / expert parallelism) is not yet supported" in errors["cp"]
    rows = errors["rows_and_contraction"]
    assert rows.startswith("NotImplementedError") and "sequence-parallel input of a row-parallel GEMM" in rows
    assert errors["axes_length"].startswith("ValueError: argument 'input_axes' must name one logical axis")
    assert errors["dropout"].startswith("NotImplementedError: fused_attn over a mesh: dropout_probability > 0")
    fp8 = errors["fp8_shard"]
    assert fp8.startswith("ValueError: FP8 dense over a mesh needs multiples of 16") and "8 rows" in fp8


# ---- the sharding module on one device --------------------------------------------------------


def test_reference_names():
    names = (
        "BATCH_AXES SEQLEN_AXES SEQLEN_TP_AXES SEQLEN_CP_AXES HEAD_AXES HIDDEN_AXES HIDDEN_TP_AXES JOINED_AXES "
        "W_NO_SHARD_AXES W_FSDP_AXES W_TP_AXES W_JOINED_AXES is_mesh_available "
        "get_sharding_map_logic_axis_to_mesh_axis "
        "with_sharding_constraint with_sharding_constraint_by_logical_axes get_all_mesh_axes get_padded_spec "
        "lax_paral_op num_of_devices get_num_devices_in_mesh get_mesh_axis_size get_mesh_axis_rank MeshResource "
        "global_shard_guard global_mesh_resource get_active_resource_axis all_reduce_sum_along_dp_fsdp "
        "all_reduce_sum_along_dp_fsdp_tpsp all_reduce_max_along_all_axes_except_PP tpsp_axis_size "
        "dp_or_fsdp_axis_size ep_axis_size"
    )
    assert [n for n in names.split() if not hasattr(sharding, n)] == []
    assert te_jax.flax.extend_logical_axis_rules is sharding.extend_logical_axis_rules


def test_logical_axis_map_follows_the_mesh_resource():
    with sharding.global_shard_guard(sharding.MeshResource(dp_resource="data", fsdp_resource="fs", tp_resource="m")):
        rules = sharding.get_sharding_map_logic_axis_to_mesh_axis()
        assert rules[sharding.BATCH_AXES] == ("data", "fs")
        assert rules[sharding.HEAD_AXES] == rules[sharding.W_TP_AXES] == rules[sharding.HIDDEN_TP_AXES] == "m"
        assert rules[sharding.W_FSDP_AXES] == "fs" and rules[sharding.SEQLEN_TP_AXES] is None
        assert rules[sharding.HIDDEN_AXES] is None and rules[sharding.W_NO_SHARD_AXES] is None
    with sharding.global_shard_guard(sharding.MeshResource(tp_resource="m", tpsp_resource="sp")):
        rules = sharding.get_sharding_map_logic_axis_to_mesh_axis()
        assert (
            rules[sharding.SEQLEN_TP_AXES] == rules[sharding.W_TP_AXES] == "sp" and rules[sharding.BATCH_AXES] is None
        )
    extended = sharding.extend_logical_axis_rules((("batch", "data"), (sharding.W_TP_AXES, "other")))
    assert extended[:2] == (("batch", "data"), (sharding.W_TP_AXES, "other"))
    assert dict(extended)[sharding.W_FSDP_AXES] is None
    with pytest.raises(TypeError, match="argument 'rules' must be a sequence of"):
        sharding.extend_logical_axis_rules(("batch",))


def test_without_a_mesh_constraints_change_nothing():
    x = jax.numpy.ones((4, 8))
    assert not sharding.is_mesh_available() and sharding.get_all_mesh_axes() == ()
    assert sharding.with_sharding_constraint_by_logical_axes(x, (sharding.BATCH_AXES, None)) is x
    assert sharding.get_padded_spec(("a",), 3) == ("a", None, None) and sharding.get_mesh_axis_size("tp") == 1
    with pytest.raises(ValueError, match="more than ndim=1"):
        sharding.get_padded_spec(("a", "b"), 1)


def test_mesh_rules_and_errors_on_one_device():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("dp", "cp"))
    x = jax.numpy.ones((4, 8))
    with jax.set_mesh(mesh):
        assert sharding.is_mesh_available() and sharding.get_all_mesh_axes() == ("dp", "cp")
        with pytest.raises(ValueError, match=r"argument 'axis' must be an axis of the mesh \('dp', 'cp'\)"):
            sharding.get_mesh_axis_size("tp")
        with pytest.raises(ValueError, match="must name one axis per dim of x"):
            sharding.with_sharding_constraint_by_logical_axes(x, (sharding.BATCH_AXES,))
        with sharding.global_shard_guard(sharding.MeshResource(dp_resource="dp")):
            # an axis of size 1 shards nothing: the ops take their single-device path
            assert sharding.generate_pspec((sharding.BATCH_AXES, None)) == jax.sharding.PartitionSpec(None, None)
            np.testing.assert_array_equal(te_jax.dense.dense(x, jax.numpy.ones((8, 16))), np.full((4, 16), 8.0))
        with sharding.global_shard_guard(sharding.MeshResource(tp_resource="model")):
            with pytest.raises(ValueError, match=r"MeshResource.tp_resource='model' is not an axis of the mesh"):
                te_jax.dense.dense(x, jax.numpy.ones((8, 16)))
