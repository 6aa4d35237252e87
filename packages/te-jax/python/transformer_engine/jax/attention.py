"""transformer_engine.jax.attention: fused scaled dot-product attention (the reference's names).

    out = fused_attn((q, k, v), bias, SequenceDescriptor.from_seqlens((q_lens, kv_lens)), seed,
                     AttnBiasType.NO_BIAS, AttnMaskType.PADDING_CAUSAL_MASK, QKVLayout.BSHD_BSHD_BSHD,
                     AttnSoftmaxType.VANILLA_SOFTMAX, scaling_factor=0.125, dropout_probability=0.0,
                     is_training=True)

One op over te-core's te_attention_fwd / te_attention_bwd (core/include/te/attention.h: the
formulas, masks, windows, softmax variants and dropout rule), with a custom VJP: the forward
saves o and softmax_lse, the backward recomputes P from them. CPU backend, and on GPUs cuDNN or
the core's own CUDA kernel (te_attention_backend picks).

What fused_attn supports:
  - layouts BS3HD, BSHD_BS2HD, BSHD_BSHD_BSHD (q [b, s, h, d]) and T3HD, THD_T2HD, THD_THD_THD
    (the reference's thd: [b, s, h, d] rows, each packing up to max_segments_per_seq sequences;
    converted to te-core's packed [b * s, h, d] with cu_seqlens and padded offsets inside the op);
  - every AttnMaskType, sliding windows, GQA/MQA, pre/post-scale bias ([b or 1, h or 1, sq, skv])
    with its gradient, the three softmax types (learnable: softmax_offset [1, h, 1, 1] float32
    with its gradient), dropout (te-core's Philox stream keyed by the seed's two words);
  - sequences from SequenceDescriptor.from_seqlens (bshd), from_seqlens_and_offsets (thd:
    lengths [b, M] and in-row offsets [b, M + 1], -1 for unused), from_segment_ids_and_pos
    (segment ids 1..M in order of appearance, 0 = padding; each segment contiguous; positions
    must be 0, 1, ... within each segment: causal masks use the in-sequence index), or a legacy
    boolean mask [b, 1, sq, skv] (True = masked out) from which padding lengths are read.

Not supported (NotImplementedError naming the argument): FP8 q/k/v (te-core has no FP8
attention yet), context parallelism (context_parallel_*, stripe_size; the token reorderings
reorder_causal_load_balancing and its inverse are there), score_mod callbacks,
return_max_logit, dropout over a mesh.
Over a mesh (jax.set_mesh and a MeshResource) the rows split over the batch axes (bshd) and
the heads over tp, with no collective (_sharded_attention.py; docs/te_jax.md).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from enum import Enum

import jax
import jax.numpy as jnp

from ._partition import active_mesh
from ._sequences import (
    SequenceDescriptor,
    reorder_tokens,
    run_length_fill,
    run_length_fill_flattened,
    to_core_seqlens,
)
from .cpp_extensions._checks import FP8, HIGH_PRECISION
from .cpp_extensions.attention import attention_bwd, attention_fwd, make_rng_state

__all__ = [
    "AttnBiasType",
    "AttnMaskType",
    "AttnSoftmaxType",
    "CPStrategy",
    "QKVFormat",
    "QKVLayout",
    "ReorderStrategy",
    "SequenceDescriptor",
    "canonicalize_attn_mask_type",
    "fused_attn",
    "fused_attn_thd",
    "inverse_reorder_causal_load_balancing",
    "is_fused_attn_kernel_available",
    "make_swa_mask",
    "reorder_causal_load_balancing",
    "run_length_fill",
    "run_length_fill_flattened",
]


class AttnBiasType(Enum):
    """NO_BIAS: softmax(scale * qk); PRE_SCALE_BIAS: softmax(scale * (qk + bias));
    POST_SCALE_BIAS: softmax(scale * qk + bias)."""

    NO_BIAS = 0
    PRE_SCALE_BIAS = 1
    POST_SCALE_BIAS = 2


class AttnMaskType(Enum):
    """The mask types (te/attention.h); values as the reference's NVTE_Mask_Type."""

    NO_MASK = 0
    PADDING_MASK = 1
    CAUSAL_MASK = 2
    PADDING_CAUSAL_MASK = 3
    CAUSAL_BOTTOM_RIGHT_MASK = 4
    PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5

    def is_causal(self) -> bool:
        return self in (
            AttnMaskType.CAUSAL_MASK,
            AttnMaskType.PADDING_CAUSAL_MASK,
            AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
            AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        )

    def is_padding(self) -> bool:
        return self in (
            AttnMaskType.PADDING_MASK,
            AttnMaskType.PADDING_CAUSAL_MASK,
            AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        )

    def is_bottom_right(self) -> bool:
        return self in (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)


# AttnMaskType -> te-core's mask name (transformer_engine.core.attention.ATTN_MASK_TYPES)
_CORE_MASK = {
    AttnMaskType.NO_MASK: "no_mask",
    AttnMaskType.PADDING_MASK: "padding",
    AttnMaskType.CAUSAL_MASK: "causal",
    AttnMaskType.PADDING_CAUSAL_MASK: "padding_causal",
    AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK: "causal_bottom_right",
    AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK: "padding_causal_bottom_right",
}


class AttnSoftmaxType(Enum):
    """VANILLA: exp(S) / sum exp(S); OFF_BY_ONE: exp(S) / (1 + sum exp(S));
    LEARNABLE: exp(S) / (exp(alpha_h) + sum exp(S)), alpha = softmax_offset [1, H, 1, 1]."""

    VANILLA_SOFTMAX = 0
    OFF_BY_ONE_SOFTMAX = 1
    LEARNABLE_SOFTMAX = 2

    @classmethod
    def from_str(cls, softmax_type: str) -> AttnSoftmaxType:
        """'vanilla', 'off_by_one' or 'learnable'."""
        table = {
            "vanilla": cls.VANILLA_SOFTMAX,
            "off_by_one": cls.OFF_BY_ONE_SOFTMAX,
            "learnable": cls.LEARNABLE_SOFTMAX,
        }
        if softmax_type not in table:
            raise ValueError(
                f"Unknown softmax_type: {softmax_type!r}. Valid options: 'vanilla', 'off_by_one', 'learnable'"
            )
        return table[softmax_type]


_CORE_SOFTMAX = {
    AttnSoftmaxType.VANILLA_SOFTMAX: "vanilla",
    AttnSoftmaxType.OFF_BY_ONE_SOFTMAX: "off_by_one",
    AttnSoftmaxType.LEARNABLE_SOFTMAX: "learnable",
}
_CORE_BIAS = {
    AttnBiasType.NO_BIAS: "no_bias",
    AttnBiasType.PRE_SCALE_BIAS: "pre_scale_bias",
    AttnBiasType.POST_SCALE_BIAS: "post_scale_bias",
}


class QKVFormat(Enum):
    """SBHD: [s, b, ..., h, d]; BSHD: [b, s, ..., h, d]; THD: BSHD's shape with several
    segments packed per row."""

    SBHD = 0
    BSHD = 1
    THD = 2


class QKVLayout(Enum):
    """BS3HD: qkv [b, s, 3, h, d]; BSHD_BS2HD: q [b, s, h, d], kv [b, s, 2, h, d];
    BSHD_BSHD_BSHD: three tensors; T3HD, THD_T2HD, THD_THD_THD: the same shapes with
    packed segments. (Values as the reference's NVTE_QKV_Layout.)"""

    BS3HD = 5
    BSHD_BS2HD = 7
    BSHD_BSHD_BSHD = 9
    T3HD = 10
    THD_T2HD = 12
    THD_THD_THD = 14

    def get_qkv_format(self) -> QKVFormat:
        return QKVFormat.THD if self.is_thd() else QKVFormat.BSHD

    def is_qkvpacked(self) -> bool:
        return self in (QKVLayout.BS3HD, QKVLayout.T3HD)

    def is_kvpacked(self) -> bool:
        return self in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)

    def is_separate(self) -> bool:
        return self in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)

    def is_thd(self) -> bool:
        return self in (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)

    def to_qkvpacked(self) -> QKVLayout:
        return QKVLayout.T3HD if self.is_thd() else QKVLayout.BS3HD

    def to_kvpacked(self) -> QKVLayout:
        return QKVLayout.THD_T2HD if self.is_thd() else QKVLayout.BSHD_BS2HD

    def to_separate(self) -> QKVLayout:
        return QKVLayout.THD_THD_THD if self.is_thd() else QKVLayout.BSHD_BSHD_BSHD


class CPStrategy(Enum):
    """Context-parallel strategies (names only: te-jax runs no context parallelism yet)."""

    DEFAULT = 0
    ALL_GATHER = 1
    RING = 2


class ReorderStrategy(Enum):
    """Causal load-balancing token orders (names only; see CPStrategy)."""

    DualChunkSwap = 0
    Striped = 1


def reorder_causal_load_balancing(tensor, strategy: ReorderStrategy, cp_size: int, seq_dim: int, stripe_size=None):
    """The token order of context-parallel causal load balancing (a permutation along
    seq_dim; see ReorderStrategy). te-jax has no context parallelism yet: this is the
    reordering only, for data pipelines written for the reference."""
    return reorder_tokens(tensor, ReorderStrategy(strategy).name, cp_size, seq_dim, stripe_size, False)


def inverse_reorder_causal_load_balancing(tensor, strategy: ReorderStrategy, cp_size: int, seq_dim: int,
                                          stripe_size=None):  # fmt: skip
    """The inverse of reorder_causal_load_balancing."""
    return reorder_tokens(tensor, ReorderStrategy(strategy).name, cp_size, seq_dim, stripe_size, True)


def canonicalize_attn_mask_type(attn_mask_type: str) -> AttnMaskType:
    """The AttnMaskType of a mask name (the reference's spellings)."""
    table = {
        "no_mask": AttnMaskType.NO_MASK,
        "padding": AttnMaskType.PADDING_MASK,
        "causal": AttnMaskType.CAUSAL_MASK,
        "causal_bottom_right": AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
        "bottom_right_causal": AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
        "padding_causal": AttnMaskType.PADDING_CAUSAL_MASK,
        "causal_padding": AttnMaskType.PADDING_CAUSAL_MASK,
        "padding_causal_bottom_right": AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        "causal_padding_bottom_right": AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        "bottom_right_causal_padding": AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
        "bottom_right_padding_causal": AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
    }
    if attn_mask_type not in table:
        raise ValueError(
            f"Unsupported attn_mask_type={attn_mask_type!r}, supported: 'no_mask', 'padding', 'causal', "
            "'padding_causal', 'causal_padding', 'causal_bottom_right', 'padding_causal_bottom_right'"
        )
    return table[attn_mask_type]


def make_swa_mask(segment_pos_q, segment_pos_kv, window_size=None, dtype=jnp.float32):
    """[..., 1, sq, skv] with 1 where key position j is inside the window of query position i
    (i - left <= j <= i + right; a negative side or None = unbounded), 0 elsewhere."""
    left, right = (-1, -1) if window_size is None else window_size
    pos_q = jnp.expand_dims(segment_pos_q, -1)
    pos_kv = jnp.expand_dims(segment_pos_kv, -2)
    keep = jnp.ones(jnp.broadcast_shapes(pos_q.shape, pos_kv.shape), bool)
    if left >= 0:
        keep &= pos_kv >= pos_q - left
    if right >= 0:
        keep &= pos_kv <= pos_q + right
    return jnp.expand_dims(keep, -3).astype(dtype)


def is_fused_attn_kernel_available(
    is_training,
    q_dtype,
    kv_dtype,
    qkv_layout,
    attn_bias_type,
    attn_mask_type,
    softmax_type,
    dropout_probability,
    q_num_heads,
    kv_num_heads,
    q_max_seqlen,
    kv_max_seqlen,
    head_dim_qk,
    head_dim_v,
    window_size=None,
) -> bool:
    """Whether fused_attn runs this combination: te-core has a kernel for every
    high-precision one on every device (its CPU backend; on GPUs cuDNN or the core's own
    kernel), so this is False only for FP8 or mixed types, FP8 being unsupported, heads
    that do not group (q_num_heads % kv_num_heads), a causal mask with a right window other
    than 0/-1, empty sizes or a dropout outside [0, 1)."""
    del is_training, qkv_layout, attn_bias_type, softmax_type, q_max_seqlen, kv_max_seqlen
    q_dtype, kv_dtype = jnp.dtype(q_dtype), jnp.dtype(kv_dtype)
    if q_dtype != kv_dtype or q_dtype not in [jnp.dtype(d) for d in HIGH_PRECISION]:
        return False
    if kv_num_heads is None:
        kv_num_heads = q_num_heads
    if min(q_num_heads, kv_num_heads, head_dim_qk, head_dim_v) < 1 or q_num_heads % kv_num_heads:
        return False
    if window_size is not None and attn_mask_type.is_causal() and window_size[1] not in (0, -1):
        return False
    return 0.0 <= dropout_probability < 1.0


@dataclasses.dataclass(frozen=True)
class _Config:
    """The static configuration of one attention call (te-core's names)."""

    qkv_format: str
    attn_mask_type: str
    attn_bias_type: str
    softmax_type: str
    scale: float
    dropout: float
    window_size: tuple
    max_seqlen_q: int = 0
    max_seqlen_kv: int = 0
    deterministic: bool = False

    def kwargs(self) -> dict:
        return dataclasses.asdict(self)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def core_attention(q, k, v, bias, softmax_offset, seqlens, rng_state, config: _Config):
    """te-core's attention on q, k, v in config.qkv_format (bshd, sbhd or thd), with a
    custom VJP. seqlens: a dict of te-core's cu_seqlens_* arrays (or empty); rng_state:
    make_rng_state's int32 [4] or None. The building block of fused_attn and the Flax
    DotProductAttention."""
    return _core_fwd(q, k, v, bias, softmax_offset, seqlens, rng_state, config)[0]


def _core_fwd(q, k, v, bias, softmax_offset, seqlens, rng_state, config):
    o, lse = attention_fwd(
        q, k, v, bias=bias, softmax_offset=softmax_offset, rng_state=rng_state, **seqlens, **config.kwargs()
    )
    return o, (q, k, v, bias, softmax_offset, seqlens, rng_state, o, lse)


def _core_bwd(config, residuals, d_o):
    q, k, v, bias, softmax_offset, seqlens, rng_state, o, lse = residuals
    g = attention_bwd(
        q,
        k,
        v,
        o,
        d_o.astype(o.dtype),
        lse,
        bias=bias,
        softmax_offset=softmax_offset,
        rng_state=rng_state,
        **seqlens,
        **config.kwargs(),
    )
    # (integer inputs: no cotangent)
    return g.dq, g.dk, g.dv, g.dbias, g.dsoftmax_offset, None, None


core_attention.defvjp(_core_fwd, _core_bwd)


def _unpack(qkv, qkv_layout: QKVLayout):
    """(q, k, v) from the layout's tuple (packed ones split along their axis -3)."""
    expected = 1 if qkv_layout.is_qkvpacked() else 2 if qkv_layout.is_kvpacked() else 3
    if not isinstance(qkv, (tuple, list)) or len(qkv) != expected:
        raise ValueError(f"argument 'qkv' must be a tuple of {expected} array(s) with qkv_layout={qkv_layout.name}")
    if qkv_layout.is_qkvpacked():
        if qkv[0].ndim != 5 or qkv[0].shape[-3] != 3:
            raise ValueError(f"argument 'qkv' must be [b, s, 3, h, d] with {qkv_layout.name}, got {qkv[0].shape}")
        return qkv[0][..., 0, :, :], qkv[0][..., 1, :, :], qkv[0][..., 2, :, :]
    if qkv_layout.is_kvpacked():
        q, kv = qkv
        if kv.ndim != 5 or kv.shape[-3] != 2:
            raise ValueError(f"argument 'qkv' must be (q, kv [b, s, 2, h, d]) with {qkv_layout.name}, got {kv.shape}")
        return q, kv[..., 0, :, :], kv[..., 1, :, :]
    return tuple(qkv)


def _unsupported(**named) -> None:
    for name, (value, default) in named.items():
        if value != default and not (default is None and value is None):
            raise NotImplementedError(f"fused_attn: argument '{name}' is not yet supported by te-jax (got {value!r})")


def fused_attn(
    qkv,
    bias,
    sequence_descriptor,
    seed,
    attn_bias_type: AttnBiasType,
    attn_mask_type: AttnMaskType,
    qkv_layout: QKVLayout,
    softmax_type: AttnSoftmaxType,
    scaling_factor: float,
    dropout_probability: float,
    is_training: bool,
    max_segments_per_seq: int = 1,
    window_size=None,
    context_parallel_strategy: CPStrategy = CPStrategy.DEFAULT,
    context_parallel_causal_load_balanced: bool = False,
    context_parallel_axis: str = "",
    context_checkpoint_name: str = "context",
    softmax_offset=None,
    stripe_size=None,
    score_mod=None,
    score_mod_bprop=None,
    score_mod_tensors=None,
    score_mod_bprop_tensors=None,
    return_max_logit: bool = False,
):
    """Attention of qkv (see the module docstring) -> [b, s_q, h, d_v] in q's type.
    seed: a PRNG key or uint32 [2] (any leading per-device copies: the first is used),
    required when dropout_probability > 0 and is_training."""
    del context_checkpoint_name  # (a rematerialization name; no remat policy uses it yet)
    _unsupported(
        context_parallel_strategy=(context_parallel_strategy, CPStrategy.DEFAULT),
        context_parallel_causal_load_balanced=(context_parallel_causal_load_balanced, False),
        context_parallel_axis=(context_parallel_axis, ""),
        stripe_size=(stripe_size, None),
        score_mod=(score_mod, None),
        score_mod_bprop=(score_mod_bprop, None),
        score_mod_tensors=(score_mod_tensors, None),
        score_mod_bprop_tensors=(score_mod_bprop_tensors, None),
        return_max_logit=(return_max_logit, False),
    )
    for name, enum, value in (
        ("attn_bias_type", AttnBiasType, attn_bias_type),
        ("attn_mask_type", AttnMaskType, attn_mask_type),
        ("qkv_layout", QKVLayout, qkv_layout),
        ("softmax_type", AttnSoftmaxType, softmax_type),
    ):
        if not isinstance(value, enum):
            raise TypeError(f"argument '{name}' must be a {enum.__name__}, got {value!r}")
    q, k, v = _unpack(qkv, qkv_layout)
    if jnp.dtype(q.dtype) in [jnp.dtype(d) for d in FP8]:
        raise NotImplementedError("fused_attn: FP8 q/k/v are not yet supported (te-core has no FP8 attention yet)")
    bias = _check_bias(bias, attn_bias_type, q)
    softmax_offset = _check_offset(softmax_offset, softmax_type, q)
    dropout = float(dropout_probability) if is_training else 0.0
    rng_state = None
    if dropout > 0.0:
        if seed is None:
            raise ValueError("argument 'seed' is required for dropout_probability > 0 with is_training=True")
        rng_state = make_rng_state(_first_key(seed))
    thd = qkv_layout.is_thd()
    seqlens = to_core_seqlens(sequence_descriptor, attn_mask_type, thd, q, k, max_segments_per_seq)
    config = _Config(
        qkv_format="thd" if thd else "bshd",
        attn_mask_type=_CORE_MASK[attn_mask_type],
        attn_bias_type=_CORE_BIAS[attn_bias_type],
        softmax_type=_CORE_SOFTMAX[softmax_type],
        scale=float(scaling_factor),
        dropout=dropout,
        window_size=(-1, -1) if window_size is None else tuple(int(w) for w in window_size),
        max_seqlen_q=q.shape[1] if thd else 0,
        max_seqlen_kv=k.shape[1] if thd else 0,
        # (the reference's switch: "0" asks for a deterministic backward)
        deterministic=os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1") == "0",
    )
    mesh = active_mesh()
    if mesh is not None:  # rows over the batch, heads over tp (docs/te_jax.md)
        from ._sharded_attention import sharded_core_attention

        return sharded_core_attention(mesh, q, k, v, bias, softmax_offset, seqlens, config, _core_fwd, _core_bwd)
    if not thd:
        return core_attention(q, k, v, bias, softmax_offset, seqlens, rng_state, config)
    # thd: the rows [b, s] flattened into te-core's packed token dimension
    flat = [x.reshape(-1, *x.shape[2:]) for x in (q, k, v)]
    o = core_attention(*flat, bias, softmax_offset, seqlens, rng_state, config)
    return o.reshape(*q.shape[:2], *o.shape[1:])


def fused_attn_thd(*args, **kwargs):
    """Deprecated in the reference: call fused_attn with a SequenceDescriptor."""
    raise NotImplementedError(
        "fused_attn_thd is deprecated: call fused_attn with a thd QKVLayout and "
        "SequenceDescriptor.from_seqlens_and_offsets(...) (or from_segment_ids_and_pos)"
    )


def _first_key(seed):
    """One key from a seed of per-device copies ([n, 2] uint32 or n typed keys)."""
    if jnp.issubdtype(jnp.asarray(seed).dtype, jax.dtypes.prng_key):
        seed = jax.random.key_data(seed)
    seed = jnp.asarray(seed)
    return seed.reshape(-1, seed.shape[-1])[0] if seed.ndim > 1 else seed


def _check_bias(bias, attn_bias_type, q):
    if attn_bias_type == AttnBiasType.NO_BIAS:
        if bias is not None:
            raise ValueError("argument 'bias' must be None with attn_bias_type=NO_BIAS")
        return None
    if bias is None:
        raise ValueError(f"argument 'bias' is required with attn_bias_type={attn_bias_type.name}")
    return bias.astype(q.dtype)


def _check_offset(softmax_offset, softmax_type, q):
    if softmax_type != AttnSoftmaxType.LEARNABLE_SOFTMAX:
        if softmax_offset is not None:
            raise ValueError("argument 'softmax_offset' is only for softmax_type=LEARNABLE_SOFTMAX")
        return None
    heads = q.shape[-2]
    if softmax_offset is None or softmax_offset.size != heads:
        raise ValueError(
            f"argument 'softmax_offset' ({heads} float32 values, e.g. [1, {heads}, 1, 1]) is required "
            "with softmax_type=LEARNABLE_SOFTMAX"
        )
    return softmax_offset.astype(jnp.float32)
