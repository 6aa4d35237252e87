"""The sharding checks of test_jax_sharding.py, run in a process of their own:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python jax_sharding_cases.py  -> JSON on stdout

(XLA reads the flag once, when the CPU client starts: the shared pytest session has one device.)
Each case runs an op (or Flax module) forward and backward (jax.vjp with a fixed dy, no
loss reduction, so every collective in the HLO is the op's own), once on one device and once
under jit over a mesh of the 8 devices with a MeshResource, and reports per output the largest
difference relative to the output's largest magnitude, whether it is bit-identical, and the
collectives of the compiled HLO with their result shapes. Importing this module runs nothing.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zlib

RECIPES = ("none", "delayed", "current")
# (case name, mesh shape, op): the op builders are in _build below.
# fsdp: rows on dp and fsdp (dW reduce-scattered); fsdpw: rows replicated (dW sliced to the shard).
DENSE_LAYOUTS = ("col", "row", "col_sp", "row_sp", "fsdp", "fsdpw")
CASES = (
    [f"dense-{layout}-{r}" for layout in DENSE_LAYOUTS for r in RECIPES]
    + [f"layernorm_dense-sp_fsdp-{r}" for r in RECIPES]
    + [f"layernorm_mlp-{layout}-{r}" for layout in ("sp_fsdp", "bf16") for r in RECIPES]
    + ["layernorm-sp-none", "activation-tp-none", "softmax-masked-none", "softmax-causal-none"]
    + ["attention-causal_gqa-none", "attention-padding_bias-none", "attention-thd-none", "attention-learnable-none"]
    # MXFP8 and FP8 blocks (stateless, blocks local to a shard): layouts whose shards hold whole blocks
    + ["dense-col-mxfp8", "dense-row-mxfp8", "dense-col_sp-mxfp8", "dense-col-fp8_block", "dense-row-fp8_block"]
    + ["dense-col-nvfp4", "dense-row-nvfp4"]
    + [f"flax_{m}-{r}" for m in ("DenseGeneral", "LayerNormDenseGeneral", "LayerNormMLP") for r in ("none", "delayed")]
    + ["flax_MultiHeadAttention-none", "flax_MultiHeadAttention-delayed", "flax_TransformerLayer-delayed"]
)
_COLLECTIVE = re.compile(
    r"= (\([^)]*\)|\S+) (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(?:-start)?\((.*)"
)


_CALL = re.compile(r'custom_call_target="(te_jax_\w+)".*?operand_layout_constraints=\{([a-z0-9]+\[[0-9,]*\])')
_CALL_FIRST = re.compile(r'operand_layout_constraints=\{([a-z0-9]+\[[0-9,]*\])[^\n]*custom_call_target="(te_jax_\w+)"')


def ffi_calls(hlo: str) -> list[list[str]]:
    """[target, shape of its first operand] of each te-jax FFI call in compiled HLO text: the
    per-device block the kernel runs on (a call XLA did not partition sees the whole array)."""
    calls = [[t, s] for t, s in _CALL.findall(hlo)]
    return calls + [[t, s] for s, t in _CALL_FIRST.findall(hlo)]


def collectives(hlo: str) -> list[dict]:
    """Each collective of compiled HLO text: kind, result shapes (a combined all-reduce has
    several; layouts dropped) and the size of its device groups."""
    found = []
    for shape, kind, rest in _COLLECTIVE.findall(hlo):
        shapes = re.findall(r"[a-z0-9]+\[[0-9,]*\]", re.sub(r"\{[^}]*\}", "", shape))
        groups = re.search(r"replica_groups=\{\{([0-9,]*)\}", rest)
        group = len(groups.group(1).split(",")) if groups else 0
        found.append({"kind": kind, "shapes": shapes, "group": group})
    return found


_WITH_SETS = ("dense", "layernorm_dense", "layernorm_mlp")  # ops whose last argument is a quantizer set (or two)


def _arrays(seed: int):
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)

    def f32(*shape, scale=1.0, offset=0.0):
        return jnp.asarray(rng.standard_normal(shape) * scale + offset, jnp.float32)

    return f32


def _recipe(name):
    from transformer_engine.common import recipe

    return {
        "none": None,
        "delayed": recipe.DelayedScaling(),
        "current": recipe.Float8CurrentScaling(),
        "mxfp8": recipe.MXFP8BlockScaling(),
        "fp8_block": recipe.Float8BlockScaling(),
        # (stochastic rounding draws per shard: equal to one device only without it)
        "nvfp4": recipe.NVFP4BlockScaling(disable_stochastic_rounding=True),
    }[name]


def _mesh_resource(mesh_axes, sp: bool):
    from transformer_engine.jax.sharding import MeshResource

    return MeshResource(
        dp_resource="dp" if "dp" in mesh_axes else None,
        fsdp_resource="fsdp" if "fsdp" in mesh_axes else None,
        tp_resource="tp",
        tpsp_resource="tp" if sp else None,
    )


def _dense_case(layout, qs, f32):
    from transformer_engine.jax import sharding as s
    from transformer_engine.jax.dense import dense

    x, k, b = f32(4, 16, 64), f32(64, 128, scale=0.1), f32(128)
    lead = (s.BATCH_AXES, s.SEQLEN_TP_AXES if layout.endswith("sp") else None)
    axes = {
        "col": {"input_axes": (*lead, s.HIDDEN_AXES), "kernel_axes": (s.W_NO_SHARD_AXES, s.W_TP_AXES)},
        "col_sp": {"input_axes": (*lead, s.HIDDEN_AXES), "kernel_axes": (s.W_NO_SHARD_AXES, s.W_TP_AXES)},
        "row": {"input_axes": (s.BATCH_AXES, None, s.HIDDEN_TP_AXES), "kernel_axes": (s.W_TP_AXES, None)},
        "row_sp": {
            "input_axes": (s.BATCH_AXES, None, s.HIDDEN_TP_AXES),
            "kernel_axes": (s.W_TP_AXES, None),
            "output_axes": (s.BATCH_AXES, s.SEQLEN_TP_AXES, s.HIDDEN_AXES),
        },
        "fsdp": {"input_axes": (s.BATCH_AXES, None, None), "kernel_axes": (s.W_FSDP_AXES, s.W_TP_AXES)},
        "fsdpw": {"input_axes": (None, None, None), "kernel_axes": (s.W_FSDP_AXES, s.W_TP_AXES)},
    }[layout]
    k = k if layout != "row" and layout != "row_sp" else f32(128, 64, scale=0.1)
    b = b if layout != "row" and layout != "row_sp" else f32(64)
    if layout.startswith("row"):
        x = f32(4, 16, 128)
    return (lambda x, k, b, q: dense(x, k, b, **axes, quantizer_set=q)), (x, k, b, qs)


def _attention_case(layout, f32):
    """fused_attn (bshd GQA causal; padding + a bias shared by the batch; thd segments; a
    learnable softmax offset) on b=4, s=16, h=8 query and 4 kv heads: rows over dp, heads over tp."""
    import jax
    import numpy as np

    from transformer_engine.jax import attention as A

    q, k, v = f32(4, 16, 8, 16), f32(4, 16, 4, 16), f32(4, 16, 4, 16)
    mask = {
        "causal_gqa": A.AttnMaskType.CAUSAL_MASK,
        "padding_bias": A.AttnMaskType.PADDING_CAUSAL_MASK,
        "thd": A.AttnMaskType.PADDING_CAUSAL_MASK,
        "learnable": A.AttnMaskType.CAUSAL_MASK,
    }[layout]
    layout_enum = A.QKVLayout.THD_THD_THD if layout == "thd" else A.QKVLayout.BSHD_BSHD_BSHD
    desc, bias_type, softmax, segments = None, A.AttnBiasType.NO_BIAS, A.AttnSoftmaxType.VANILLA_SOFTMAX, 1
    if layout == "padding_bias":
        desc = A.SequenceDescriptor.from_seqlens(jax.numpy.asarray([16, 9, 3, 12], jax.numpy.int32))
        bias_type = A.AttnBiasType.POST_SCALE_BIAS
    if layout == "thd":
        ids = np.repeat(np.array([[1] * 6 + [2] * 7 + [0] * 3]), 4, axis=0)
        ids[1, :] = [1] * 16
        pos = np.concatenate([np.arange(6), np.arange(7), np.zeros(3, int)])[None].repeat(4, axis=0)
        pos[1, :] = np.arange(16)
        desc = A.SequenceDescriptor.from_segment_ids_and_pos(jax.numpy.asarray(ids), jax.numpy.asarray(pos))
        segments = 2
    if layout == "learnable":
        softmax = A.AttnSoftmaxType.LEARNABLE_SOFTMAX

    def fn(q, k, v, bias, offset):
        return A.fused_attn(
            (q, k, v), bias, desc, None, bias_type, mask, layout_enum, softmax, 0.25, 0.0, True,
            max_segments_per_seq=segments, softmax_offset=offset,
        )  # fmt: skip

    bias = f32(1, 8, 16, 16) if layout == "padding_bias" else None
    offset = f32(1, 8, 1, 1) if layout == "learnable" else None
    return fn, (q, k, v, bias, offset)


def _build(name: str):
    """(function of the arguments, arguments, mesh shape, mesh axes, sequence parallel)."""
    import jax
    import numpy as np

    from transformer_engine.jax import sharding as s
    from transformer_engine.jax.activation import activation
    from transformer_engine.jax.layernorm import layernorm
    from transformer_engine.jax.layernorm_dense import layernorm_dense
    from transformer_engine.jax.layernorm_mlp import layernorm_mlp
    from transformer_engine.jax.quantize import QuantizerFactory

    op, layout, rname = name.split("-")
    f32 = _arrays(zlib.crc32(name.encode()))
    rec = _recipe(rname)
    q1, q2 = QuantizerFactory.create_set(rec), QuantizerFactory.create_set(rec)
    dp_tp, dp_fsdp_tp = ((2, 4), ("dp", "tp")), ((2, 2, 2), ("dp", "fsdp", "tp"))
    x, gamma, beta = f32(4, 16, 64), f32(64, scale=0.1, offset=1.0), f32(64, scale=0.1)
    norm_axes = (s.BATCH_AXES, s.SEQLEN_TP_AXES, s.HIDDEN_AXES)
    if op == "dense":
        fn, args = _dense_case(layout, q1, f32)
        return fn, args, *(dp_fsdp_tp if layout.startswith("fsdp") else dp_tp), layout.endswith("sp")
    if op == "layernorm_dense":
        k, b = f32(64, 128, scale=0.1), f32(128)

        def fn(x, k, g, be, b, q):
            return layernorm_dense(
                x,
                k,
                g,
                be,
                b,
                layernorm_input_axes=norm_axes,
                kernel_axes=(s.W_FSDP_AXES, s.W_TP_AXES),
                quantizer_set=q,
            )

        return fn, (x, k, gamma, beta, b, q1), *dp_fsdp_tp, True
    if op == "layernorm_mlp":
        k1, b1, k2, b2 = f32(64, 2, 128, scale=0.1), f32(2, 128), f32(128, 64, scale=0.1), f32(64)

        def fn(x, g, k1, k2, b1, b2, qs):
            return layernorm_mlp(
                x, g, None, [k1, k2], [b1, b2], "rmsnorm", norm_input_axes=norm_axes,
                kernel_1_axes=(s.W_FSDP_AXES, s.W_JOINED_AXES, s.W_TP_AXES), kernel_2_axes=(s.W_TP_AXES, s.W_FSDP_AXES),
                activation_type=("silu", "linear"), quantizer_sets=qs,
            )  # fmt: skip

        args = (x, gamma, k1, k2, b1, b2)
        if layout == "bf16":  # 16-bit activations and weights: FP32 sums rounded per shard
            args = tuple(a.astype(jax.numpy.bfloat16) for a in args)
        return fn, (*args, (q1, q2)), *dp_fsdp_tp, True
    if op == "layernorm":
        return (lambda x, g, be: layernorm(x, g, be, "layernorm")), (x, gamma, beta), *dp_tp, True
    if op == "softmax":
        from transformer_engine.jax.softmax import SoftmaxFusionType, softmax

        logits = f32(4, 8, 16, 16, scale=3.0)
        if layout == "causal":
            return (
                (lambda t: softmax(t, None, 0.5, SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED)),
                (logits,),
                *dp_tp,
                False,
            )
        mask = jax.numpy.asarray(np.random.default_rng(1).random((4, 1, 16, 16)) < 0.3)
        return (lambda t: softmax(t, mask, 0.5, SoftmaxFusionType.SCALED_MASKED)), (logits,), *dp_tp, False
    if op == "attention":
        return (*_attention_case(layout, f32), *dp_tp, False)
    if op == "activation":
        return (lambda h: activation(h, ("gelu", "linear"))), (f32(4, 16, 2, 128),), *dp_tp, False
    raise ValueError(name)


def _flax(name: str):
    """A Flax module case: (apply function of (params, state, x), its arguments, mesh, axes, rules)."""

    from transformer_engine.jax import flax as te_flax

    module_name, rname = name.split("-")
    module_name = module_name[len("flax_") :]
    f32 = _arrays(zlib.crc32(name.encode()))
    axes = ("batch", "length", "embed")
    if module_name == "DenseGeneral":
        model = te_flax.DenseGeneral(features=128, kernel_axes=("embed", "mlp"), input_axes=axes)
    elif module_name == "LayerNormDenseGeneral":
        model = te_flax.LayerNormDenseGeneral(features=128, kernel_axes=("embed", "mlp"), layernorm_input_axes=axes)
    elif module_name == "MultiHeadAttention":  # GQA: the query and kv projections apart
        model = te_flax.MultiHeadAttention(head_dim=16, num_attention_heads=8, num_gqa_groups=4)
    elif module_name == "TransformerLayer":
        model = te_flax.TransformerLayer(
            hidden_size=64, mlp_hidden_size=128, num_attention_heads=4, hidden_dropout=0.0, attention_dropout=0.0
        )
    else:
        model = te_flax.LayerNormMLP(intermediate_dim=128, activations=("gelu", "linear"), layernorm_input_axes=axes)
    rules = (("batch", "dp"), ("length", None), ("embed", None), ("act", None), ("mlp", "tp"))
    return model, f32(4, 16, 64), _recipe(rname), rules


def _compare(ref, out, state_of) -> dict:
    """Per leaf of (y, grads): the largest difference relative to the reference's largest
    magnitude and bit-identity; state_exact: the quantizer states (state_of(grads)) identical."""
    import jax
    import numpy as np

    states = zip(jax.tree.leaves(state_of(ref[1])), jax.tree.leaves(state_of(out[1])))
    state_exact = [bool(np.array_equal(np.asarray(a), np.asarray(c))) for a, c in states]
    rel, exact = [], []
    for a, c in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
        a, c = np.asarray(a, np.float64), np.asarray(c, np.float64)
        scale = np.max(np.abs(a)) if a.size else 0.0
        rel.append(float(np.max(np.abs(a - c)) / scale) if scale else float(np.max(np.abs(c), initial=0.0)))
        exact.append(bool(np.array_equal(a, c, equal_nan=True)))
    return {"rel": rel, "exact": exact, "state_exact": state_exact}


def _run_op(name: str) -> dict:
    import jax
    import numpy as np

    import transformer_engine.jax as te_jax

    fn, args, shape, axes, sp = _build(name)
    y_shape = jax.eval_shape(fn, *args)
    dy = jax.numpy.asarray(np.random.default_rng(7).standard_normal(y_shape.shape), y_shape.dtype)

    def step(args, dy):
        y, pullback = jax.vjp(fn, *args)
        return y, pullback(dy)

    ref = jax.jit(step)(args, dy)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), axes)
    with jax.set_mesh(mesh), te_jax.autocast(enabled=False, mesh_resource=_mesh_resource(axes, sp)):
        compiled = jax.jit(step).lower(args, dy).compile()
        out = compiled(args, dy)
    result = _compare(ref, out, lambda grads: grads[-1] if name.split("-")[0] in _WITH_SETS else ())
    result["y_exact"] = bool(np.array_equal(np.asarray(ref[0]), np.asarray(out[0])))
    result["y_dtype"] = str(out[0].dtype)
    result["collectives"] = collectives(compiled.as_text())
    result["ffi_calls"] = ffi_calls(compiled.as_text())
    return result


def _run_flax(name: str) -> dict:
    import flax.linen as nn
    import jax
    import numpy as np

    import transformer_engine.jax as te_jax
    from transformer_engine.jax import flax as te_flax

    model, x, rec, rules = _flax(name)
    enabled = rec is not None
    with te_jax.autocast(enabled=enabled, recipe=rec):
        init_args = (x, x) if isinstance(model, te_flax.MultiHeadAttention) else (x,)
        variables = model.init(jax.random.PRNGKey(0), *init_args)
    params = variables["params"]
    state = {k: v for k, v in variables.items() if k != "params"}  # fp8_metas under DelayedScaling

    def step(params, state, x):
        def loss(p, s, x):
            two = isinstance(model, te_flax.MultiHeadAttention)  # (inputs_q, inputs_kv)
            y = model.apply({"params": p, **s}, x, x) if two else model.apply({"params": p, **s}, x)
            y = y[0] if isinstance(y, tuple) else y
            return jax.numpy.sum(y * jax.numpy.cos(y)), y

        (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(params, state, x)
        return y, grads

    with te_jax.autocast(enabled=enabled, recipe=rec):
        ref = jax.jit(step)(params, state, x)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
    resource = te_jax.MeshResource(dp_resource="dp", tp_resource="tp")
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), te_jax.autocast(enabled, rec, mesh_resource=resource):
        compiled = jax.jit(step).lower(params, state, x).compile()
        out = compiled(params, state, x)
    result = _compare(ref, out, lambda grads: grads[1])  # the fp8_metas "gradient": the new state
    result["weights"] = sorted(
        {str(list(np.shape(w))).replace(" ", "") for w in jax.tree.leaves(params) if np.ndim(w) >= 2}
    )
    result["y_exact"] = bool(np.array_equal(np.asarray(ref[0]), np.asarray(out[0])))
    result["collectives"] = collectives(compiled.as_text())
    result["ffi_calls"] = ffi_calls(compiled.as_text())
    return result


def _errors() -> dict:
    """The message each unsupported layout raises (the test checks they name the problem)."""
    import jax
    import numpy as np

    import transformer_engine.jax as te_jax
    from transformer_engine.jax import sharding as s
    from transformer_engine.jax.dense import dense
    from transformer_engine.jax.quantize import QuantizerFactory

    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("dp", "tp"))
    x, k = jax.numpy.ones((4, 16, 64)), jax.numpy.ones((64, 128))
    dp_tp = s.MeshResource(dp_resource="dp", tp_resource="tp")
    fp8 = QuantizerFactory.create_set(_recipe("delayed"))
    attempts = {
        "cp": (s.MeshResource(dp_resource="dp", cp_resource="tp"), {}),
        "rows_and_contraction": (
            s.MeshResource(dp_resource="dp", tp_resource="tp"),
            {"input_axes": (s.BATCH_AXES, s.HEAD_AXES, None), "kernel_axes": (s.W_TP_AXES, None)},
        ),
        "axes_length": (dp_tp, {"input_axes": (s.BATCH_AXES, None)}),
        # 16 rows in all, 8 per dp shard
        "fp8_shard": (dp_tp, {"kernel_axes": (None, s.W_TP_AXES), "quantizer_set": fp8, "x": x[:2, :8]}),
    }
    messages = {}
    try:
        from transformer_engine.jax import attention as A

        q = jax.numpy.ones((4, 16, 8, 16))
        with jax.set_mesh(mesh), te_jax.autocast(mesh_resource=dp_tp):
            A.fused_attn(
                (q, q, q), None, None, jax.random.PRNGKey(0), A.AttnBiasType.NO_BIAS, A.AttnMaskType.CAUSAL_MASK,
                A.QKVLayout.BSHD_BSHD_BSHD, A.AttnSoftmaxType.VANILLA_SOFTMAX, 0.25, 0.1, True,
            )  # fmt: skip
        messages["dropout"] = "no error"
    except Exception as error:
        messages["dropout"] = f"{type(error).__name__}: {error}"
    for key, (resource, axes) in attempts.items():
        xs = axes.pop("x", x)
        try:
            with jax.set_mesh(mesh), te_jax.autocast(mesh_resource=resource):
                jax.jit(lambda x, k: dense(x, k, **axes))(xs, k)
            messages[key] = "no error"
        except Exception as error:
            messages[key] = f"{type(error).__name__}: {error}"
    return messages


def main() -> None:
    if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
        sys.exit("run with XLA_FLAGS=--xla_force_host_platform_device_count=8")
    import jax

    jax.config.update("jax_platforms", "cpu")
    assert len(jax.devices()) == 8, jax.devices()
    results = {"_errors": _errors()}
    only = set(sys.argv[1:])  # (names given: run only those, for a quick look)
    for name in CASES:
        if only and name not in only:
            continue
        try:
            results[name] = _run_flax(name) if name.startswith("flax_") else _run_op(name)
        except Exception as error:  # reported per case; the test names it
            results[name] = {"error": f"{type(error).__name__}: {error}"}
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
