"""Sequence descriptions of fused_attn (the reference's SequenceDescriptor) and their
conversion to te-core's cu_seqlens (core/include/te/attention.h).

bshd/sbhd padding masks: cu_seqlens_q/kv [b + 1] = (0, cumsum of the lengths).
thd (the reference's packed rows [b, s, h, d], up to M = max_segments_per_seq sequences
per row): te-core sees b * M sequences over b * s tokens; sequence (r, m) has length
len[r, m] and starts at row r * s + offset[r, m] (cu_seqlens_*_padded). An unused
segment has length 0 and offset s (the row's end), so the offsets stay non-decreasing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _pair(value, name: str):
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(f"argument '{name}' must be an array or a (q, kv) pair of arrays")
        return value
    if isinstance(value, (jax.Array, jnp.ndarray)) or hasattr(value, "shape"):
        return value, value
    raise TypeError(f"argument '{name}' must be an array or a (q, kv) pair of arrays, got {type(value).__name__}")


@jax.tree_util.register_pytree_node_class
class SequenceDescriptor:
    """How the sequences lie in q and kv: (q, kv) pairs of seqlens, seq_offsets,
    segment_ids and segment_pos (an unset field is a pair of empty arrays, as in the
    reference). Build one with from_seqlens (bshd), from_seqlens_and_offsets (thd) or
    from_segment_ids_and_pos (either)."""

    def __init__(self, seqlens=None, seq_offsets=None, segment_ids=None, segment_pos=None):
        empty = (jnp.zeros(0), jnp.zeros(0))
        self.seqlens = empty if seqlens is None else seqlens
        self.seq_offsets = empty if seq_offsets is None else seq_offsets
        self.segment_ids = empty if segment_ids is None else segment_ids
        self.segment_pos = empty if segment_pos is None else segment_pos

    def tree_flatten(self):
        return (self.seqlens, self.seq_offsets, self.segment_ids, self.segment_pos), None

    @classmethod
    def tree_unflatten(cls, aux_data, children):
        del aux_data
        return cls(*children)

    @classmethod
    def from_seqlens(cls, seqlens) -> SequenceDescriptor:
        """seqlens: [b] int lengths, or (q_seqlens, kv_seqlens)."""
        return cls(seqlens=_pair(seqlens, "seqlens"))

    @classmethod
    def from_seqlens_and_offsets(cls, seqlens, seq_offsets) -> SequenceDescriptor:
        """thd: seqlens [b, M] (-1 unused) and in-row seq_offsets [b, M + 1] (-1 unused),
        each an array or a (q, kv) pair."""
        return cls(seqlens=_pair(seqlens, "seqlens"), seq_offsets=_pair(seq_offsets, "seq_offsets"))

    @classmethod
    def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None) -> SequenceDescriptor:
        """segment_ids [b, s] (1, 2, ... per packed sequence, 0 = padding) and segment_pos
        [b, s] (each token's position in its segment), each an array or a (q, kv) pair.
        segment_pos is required (the reference's rule)."""
        if segment_pos is None:
            raise ValueError("argument 'segment_pos' is required (the position of each token in its segment)")
        return cls(segment_ids=_pair(segment_ids, "segment_ids"), segment_pos=_pair(segment_pos, "segment_pos"))

    def has_segment_ids(self) -> bool:
        return self.segment_ids[0].size + self.segment_ids[1].size > 0


def run_length_fill_flattened(segment_ids_flattened) -> jax.Array:
    """Each token's run length (the length of the run of equal ids it is in), 0 for id 0."""
    ids = segment_ids_flattened
    boundary = jnp.concatenate([jnp.ones((1,), bool), ids[1:] != ids[:-1]])
    run = jnp.cumsum(boundary) - 1
    counts = jnp.bincount(run, length=ids.shape[-1])
    return jnp.where(ids == 0, 0, counts[run])


def run_length_fill(segment_ids) -> jax.Array:
    """run_length_fill_flattened over the last axis of segment_ids, shape kept."""
    flat = segment_ids.reshape(-1, segment_ids.shape[-1])
    return jax.vmap(run_length_fill_flattened)(flat).reshape(segment_ids.shape)


def _cu(lengths) -> jax.Array:
    """(0, cumsum(lengths)) as int32 [n + 1]."""
    lengths = lengths.reshape(-1).astype(jnp.int32)
    return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(lengths, dtype=jnp.int32)])


def _mask_lengths(mask, mask_type):
    """q and kv lengths [b] of a legacy mask [b, 1, sq, skv] (True = masked out), as the
    reference reads them: the rows seeing key 0, the keys row 0 sees (causal: the most any
    row sees)."""
    if mask.ndim != 4:
        raise ValueError(f"a mask passed as sequence_descriptor must be [b, 1, sq, skv], got {mask.shape}")
    visible = jnp.logical_not(mask.astype(bool))
    q_lens = jnp.sum(visible, axis=-2, dtype=jnp.int32)[:, 0, 0]
    per_row = jnp.sum(visible, axis=-1, dtype=jnp.int32)
    kv_lens = per_row[:, 0, 0] if not mask_type.is_causal() else jnp.max(per_row, axis=(-1, -2))
    return q_lens, kv_lens


def _row_segments(ids, max_segments: int):
    """lengths and in-row offsets [b, M] of segments 1..M (offset s for an unused one)."""
    s = ids.shape[-1]
    ids = ids.astype(jnp.int32)
    which = ids[..., None, :] == jnp.arange(1, max_segments + 1, dtype=jnp.int32)[:, None]  # [b, M, s]
    lengths = jnp.sum(which, axis=-1, dtype=jnp.int32)
    offsets = jnp.where(lengths > 0, jnp.argmax(which, axis=-1).astype(jnp.int32), s)
    return lengths, offsets


def _given_segments(seqlens, offsets, s: int, max_segments: int):
    """from_seqlens_and_offsets's [b, M] lengths and [b, M + 1] offsets (-1 unused)."""
    if seqlens.ndim != 2 or seqlens.shape[-1] > max_segments or offsets.shape[-1] < seqlens.shape[-1]:
        raise ValueError(
            f"thd seqlens must be [b, M] with M <= max_segments_per_seq ({max_segments}) and seq_offsets "
            f"[b, M + 1], got {seqlens.shape} and {offsets.shape}"
        )
    m = seqlens.shape[-1]
    lengths = jnp.maximum(seqlens.astype(jnp.int32), 0)
    starts = offsets[..., :m].astype(jnp.int32)
    return lengths, jnp.where(lengths > 0, starts, s)


def _thd(lengths, offsets, s: int) -> tuple:
    rows = lengths.shape[0]
    padded = (offsets + s * jnp.arange(rows, dtype=jnp.int32)[:, None]).reshape(-1)
    return _cu(lengths), jnp.concatenate([padded, jnp.full((1,), rows * s, jnp.int32)])


def to_core_seqlens(desc, mask_type, thd: bool, q, k, max_segments: int) -> dict:
    """te-core's cu_seqlens_* keyword arrays for fused_attn (empty without a padding mask
    in bshd: te-core then uses the full lengths)."""
    if not thd:
        if not mask_type.is_padding():
            return {}
        if desc is None:
            raise ValueError(f"argument 'sequence_descriptor' is required with attn_mask_type={mask_type.name}")
        if not isinstance(desc, SequenceDescriptor):
            q_lens, kv_lens = _mask_lengths(jnp.asarray(desc), mask_type)
        elif desc.has_segment_ids():
            q_lens, kv_lens = (jnp.sum(ids != 0, axis=-1, dtype=jnp.int32) for ids in desc.segment_ids)
        else:
            q_lens, kv_lens = desc.seqlens
        if q_lens.ndim != 1 or kv_lens.ndim != 1:
            raise ValueError(f"bshd seqlens must be [b] each, got {q_lens.shape} and {kv_lens.shape}")
        return {"cu_seqlens_q": _cu(q_lens), "cu_seqlens_kv": _cu(kv_lens)}
    if not isinstance(desc, SequenceDescriptor):
        raise ValueError(
            "a thd qkv_layout needs argument 'sequence_descriptor' as a SequenceDescriptor "
            "(from_seqlens_and_offsets or from_segment_ids_and_pos)"
        )
    if int(max_segments) < 1:
        raise ValueError(f"argument 'max_segments_per_seq' must be >= 1, got {max_segments}")
    out = {}
    for side, x, ids, lens, offs in (
        ("q", q, desc.segment_ids[0], desc.seqlens[0], desc.seq_offsets[0]),
        ("kv", k, desc.segment_ids[1], desc.seqlens[1], desc.seq_offsets[1]),
    ):
        s = x.shape[1]
        if ids.size:
            if tuple(ids.shape) != tuple(x.shape[:2]):
                raise ValueError(f"{side} segment_ids must be [b, s] = {tuple(x.shape[:2])}, got {tuple(ids.shape)}")
            lengths, offsets = _row_segments(ids, max_segments)
        else:
            lengths, offsets = _given_segments(lens, offs, s, max_segments)
        out[f"cu_seqlens_{side}"], out[f"cu_seqlens_{side}_padded"] = _thd(lengths, offsets, s)
    if out["cu_seqlens_q"].shape != out["cu_seqlens_kv"].shape:
        raise ValueError("q and kv must describe the same number of segments per row")
    return out


def _dual_chunk_order(cp_size: int) -> list:
    """DualChunkSwap: the sequence in 2 cp chunks; rank r keeps chunk 2r and takes chunk
    2 cp - 1 - 2r (so every rank gets one early and one late chunk of a causal mask). The
    permutation is its own inverse."""
    order = []
    for r in range(cp_size):
        order += [2 * r, 2 * cp_size - 1 - 2 * r]
    return order


def reorder_tokens(tensor, strategy_name: str, cp_size: int, seq_dim: int, stripe_size, inverse: bool):
    """The token permutation of reorder_causal_load_balancing (strategy 'DualChunkSwap' or
    'Striped': rank r takes stripes r, r + cp, r + 2 cp, ... of stripe_size tokens)."""
    s = tensor.shape[seq_dim]
    if strategy_name == "DualChunkSwap":
        if stripe_size is not None:
            raise ValueError(f"argument 'stripe_size' must be None with DualChunkSwap, got {stripe_size}")
        if s % (2 * cp_size):
            raise ValueError(f"DualChunkSwap needs the sequence ({s}) divisible by 2 * cp_size ({2 * cp_size})")
        chunks = jnp.split(tensor, 2 * cp_size, axis=seq_dim)
        return jnp.concatenate([chunks[i] for i in _dual_chunk_order(cp_size)], axis=seq_dim)
    stripe = 1 if stripe_size is None else int(stripe_size)
    if stripe <= 0 or s % (cp_size * stripe):
        raise ValueError(f"Striped needs stripe_size > 0 and the sequence ({s}) divisible by cp_size * stripe_size")
    x = jnp.moveaxis(tensor, seq_dim, 0)
    rest = x.shape[1:]
    if not inverse:  # [k, r, t] -> [r, k, t]
        x = x.reshape(s // (cp_size * stripe), cp_size, stripe, *rest).swapaxes(0, 1)
    else:  # [r, k, t] -> [k, r, t]
        x = x.reshape(cp_size, s // (cp_size * stripe), stripe, *rest).swapaxes(0, 1)
    return jnp.moveaxis(x.reshape(s, *rest), 0, seq_dim)
