"""KV caching for incremental decoding (the reference's InferenceParams).

Workflow (as in the reference)::

    params = InferenceParams(max_batch, max_seqlen, num_heads_kv=hk, head_dim_k=d, dtype=dt)
    for step in ...:
        params.pre_step(OrderedDict(zip(seq_ids, step_lens)))   # prompt: its length; then 1
        out = model(x, attn_mask_type="padding_causal", inference_params=params, ...)

Each attention layer (keyed by its layer_number) copies its new keys/values
into its cache with step(); attention then runs the new queries against the
whole cache with a padding mask (each sequence's cached length) and a
bottom-right causal diagonal, which is the full-sequence causal attention
of those queries. The cache is [max_batch_size, max_sequence_length, hk, d]
per layer ("bshd"), allocated on the first keys' device. When a sequence
leaves the batch (missing from step_dict) the cache rows of the remaining
ones are moved up so that batch index i is the i-th sequence of step_dict.
With is_paged=True the cache is a pool of pages per layer (PagedKVCacheManager).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

__all__ = ["InferenceParams", "KVCacheManager", "NonPagedKVCacheManager", "PagedKVCacheManager"]

_FORMATS = ("bshd", "sbhd", "thd")


class KVCacheManager:
    """Base cache manager: cache[layer_number] = (k_cache, v_cache); sequences {seq_id: length}."""

    def __init__(self):
        self.cache = {}
        self.sequences = OrderedDict()

    def reset(self):
        self.sequences = OrderedDict()

    def allocate_memory(self, layer_number: int):
        self.cache[layer_number] = (None, None)

    def pre_step(self, step_dict: OrderedDict):
        return self.sequences

    def step(self, layer_number, new_k, new_v, cu_new_seqlens, cu_cached_seqlens, qkv_format):
        return self.cache[layer_number]


def _set_cache_shape(manager, max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v):
    """The shape attributes both cache managers keep (head_dim_v defaults to head_dim_k)."""
    manager.max_batch_size = max_batch_size
    manager.max_seqlen = max_seqlen
    manager.num_heads = num_heads
    manager.head_dim_k = head_dim_k
    manager.head_dim_v = head_dim_k if head_dim_v is None else head_dim_v
    manager.dtype = dtype


class NonPagedKVCacheManager(KVCacheManager):
    """One contiguous [max_batch_size, max_seqlen, heads, head_dim] cache per layer."""

    def __init__(self, max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v=None):
        super().__init__()
        _set_cache_shape(self, max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v)
        self._order = None  # old batch index of each new one, when the batch changed
        self._step = 0
        self._reindexed = {}  # layer -> the step its cache was last reordered at

    def reset(self):
        super().reset()
        self._order = None

    def allocate_memory(self, layer_number, device=None):
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        shape = (self.max_batch_size, self.max_seqlen, self.num_heads)
        k = torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=device)
        v = torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=device)
        self.cache[layer_number] = (k, v)

    def pre_step(self, step_dict: OrderedDict):
        old = list(self.sequences)
        kept = [s for s in old if s in step_dict]
        for s in old:
            if s not in step_dict:
                self.sequences.pop(s)
        for s in kept:
            self.sequences[s] += step_dict[s]
        for s, n in step_dict.items():
            if s not in self.sequences:
                self.sequences[s] = n
        total = max(self.sequences.values(), default=0)
        if total > self.max_seqlen:
            raise ValueError(
                f"InferenceParams: a sequence grows to {total} tokens, max_sequence_length is {self.max_seqlen}"
            )
        # The cache rows of the kept sequences move to the front, in order.
        order = [old.index(s) for s in kept]
        self._order = None if order == list(range(len(order))) else order
        self._step += 1
        return self.sequences

    def _reorder(self, layer_number, k, v):
        if self._order is None or self._reindexed.get(layer_number) == self._step:
            return
        index = torch.tensor(self._order, device=k.device)
        n = len(self._order)
        k[:n] = k[index].clone()
        v[:n] = v[index].clone()
        self._reindexed[layer_number] = self._step

    def step(self, layer_number, new_k, new_v, cu_new_seqlens, cu_cached_seqlens, qkv_format):
        k, v = self.cache.get(layer_number, (None, None))
        if k is None or k.device != new_k.device:
            self.allocate_memory(layer_number, new_k.device)
            k, v = self.cache[layer_number]
        self._reorder(layer_number, k, v)
        new_lens = (cu_new_seqlens[1:] - cu_new_seqlens[:-1]).tolist()
        total_lens = (cu_cached_seqlens[1:] - cu_cached_seqlens[:-1]).tolist()
        batch = len(self.sequences)
        for i in range(batch):
            n, end = new_lens[i], total_lens[i]
            nk, nv = _new_tokens(new_k, new_v, i, n, cu_new_seqlens, qkv_format)
            k[i, end - n : end] = nk.to(k.dtype)
            v[i, end - n : end] = nv.to(v.dtype)
        return k[:batch], v[:batch]


class PagedKVCacheManager(KVCacheManager):
    """A pool of total_num_pages pages of page_size tokens per layer
    ([pages, page_size, heads, head_dim]); each sequence holds the pages of
    its page_table row, taken from the pool as it grows and returned when it
    leaves the batch. The backends have no paged kernels, so step() returns
    the batch's pages gathered into [batch, max_pages * page_size, heads, d]
    (what the reference does for backends without paged support)."""

    def __init__(
        self, total_num_pages, page_size, num_heads, head_dim_k, dtype, max_batch_size, max_seqlen, head_dim_v=None
    ):
        super().__init__()
        self.total_num_pages = total_num_pages
        self.page_size = page_size
        _set_cache_shape(self, max_batch_size, max_seqlen, num_heads, head_dim_k, dtype, head_dim_v)
        self.max_pages_per_seq = max_seqlen // page_size
        self.reset()

    def reset(self):
        super().reset()
        self.free_pages = list(range(self.total_num_pages))
        self.allocated_pages = {}
        self.page_table = torch.zeros(self.max_batch_size, self.max_pages_per_seq, dtype=torch.int32)

    def allocate_memory(self, layer_number, device=None):
        if device is None:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        shape = (self.total_num_pages, self.page_size, self.num_heads)
        k = torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=device)
        v = torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=device)
        self.cache[layer_number] = (k, v)

    def _grow(self, seq, length):
        pages = self.allocated_pages.setdefault(seq, [])
        need = -(-length // self.page_size)
        if need > self.max_pages_per_seq:
            raise ValueError(
                f"InferenceParams: a sequence grows to {length} tokens, max_sequence_length is {self.max_seqlen}"
            )
        while len(pages) < need:
            if not self.free_pages:
                raise RuntimeError("InferenceParams: the paged KV cache is full (no free page left)")
            pages.append(self.free_pages.pop(0))

    def pre_step(self, step_dict: OrderedDict):
        for s in [s for s in self.sequences if s not in step_dict]:
            self.sequences.pop(s)
            self.free_pages.extend(self.allocated_pages.pop(s))
        for s, n in step_dict.items():
            self.sequences[s] = self.sequences.get(s, 0) + n
            self._grow(s, self.sequences[s])
        self.page_table.zero_()
        for i, s in enumerate(self.sequences):
            pages = self.allocated_pages[s]
            self.page_table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        return self.sequences

    def step(self, layer_number, new_k, new_v, cu_new_seqlens, cu_cached_seqlens, qkv_format):
        k, v = self.cache.get(layer_number, (None, None))
        if k is None or k.device != new_k.device:
            self.allocate_memory(layer_number, new_k.device)
            k, v = self.cache[layer_number]
        new_lens = (cu_new_seqlens[1:] - cu_new_seqlens[:-1]).tolist()
        total_lens = (cu_cached_seqlens[1:] - cu_cached_seqlens[:-1]).tolist()
        batch = len(self.sequences)
        table = self.page_table[:batch].to(torch.long)
        for i in range(batch):
            n, end = new_lens[i], total_lens[i]
            nk, nv = _new_tokens(new_k, new_v, i, n, cu_new_seqlens, qkv_format)
            pos = torch.arange(end - n, end)
            pages, slots = table[i, pos // self.page_size].to(k.device), (pos % self.page_size).to(k.device)
            k[pages, slots] = nk.to(k.dtype)
            v[pages, slots] = nv.to(v.dtype)
        index = table.to(k.device).flatten()
        gathered = [c[index].reshape(batch, self.max_pages_per_seq * self.page_size, *c.shape[2:]) for c in (k, v)]
        return gathered[0], gathered[1]


def _new_tokens(new_k, new_v, i, n, cu_new_seqlens, qkv_format):
    """Sequence i's n new keys and values, [n, heads, d]."""
    if qkv_format == "bshd":
        return new_k[i, :n], new_v[i, :n]
    if qkv_format == "sbhd":
        return new_k[:n, i], new_v[:n, i]
    start = int(cu_new_seqlens[i])
    return new_k[start : start + n], new_v[start : start + n]


class InferenceParams:
    """KV caches of every attention layer of a model and the running sequence lengths.

    The reference's constructor. num_heads_kv, head_dim_k and dtype are
    required (as in the reference since 2.2). qkv_format: the format of the
    tensors the attention layers get ("bshd", "sbhd" or "thd"; thd needs
    max_ctx_len). The cache itself is "bshd".
    """

    def __init__(
        self,
        max_batch_size: int,
        max_sequence_length: int,
        num_heads_kv: int = None,
        head_dim_k: int = None,
        dtype: torch.dtype = None,
        head_dim_v: int = None,
        is_paged: bool = False,
        total_num_pages: int = None,
        page_size: int = None,
        max_ctx_len: int = None,
        qkv_format: str = "bshd",
        custom_cache_manager=None,
    ):
        if any(x is None for x in (num_heads_kv, head_dim_k, dtype)):
            raise ValueError("InferenceParams: num_heads_kv, head_dim_k and dtype are required")
        if is_paged:
            if page_size is None or max_sequence_length % page_size:
                raise ValueError(
                    f"InferenceParams: a paged cache needs page_size dividing max_sequence_length="
                    f"{max_sequence_length}, got page_size={page_size}"
                )
            if total_num_pages != max_batch_size * (max_sequence_length // page_size):
                raise ValueError(
                    "InferenceParams: a paged cache needs total_num_pages = max_batch_size * "
                    f"max_sequence_length / page_size = {max_batch_size * (max_sequence_length // page_size)}, "
                    f"got {total_num_pages}"
                )
        if qkv_format not in _FORMATS:
            raise ValueError(f"InferenceParams: qkv_format must be one of {_FORMATS}, got {qkv_format!r}")
        if qkv_format == "thd" and max_ctx_len is None:
            raise ValueError("InferenceParams: max_ctx_len is required when qkv_format='thd'")
        self.max_batch_size = max_batch_size
        self.max_sequence_length = max_sequence_length
        self.num_heads_kv = num_heads_kv
        self.head_dim_k = head_dim_k
        self.head_dim_v = head_dim_k if head_dim_v is None else head_dim_v
        self.dtype = dtype
        self.is_paged = is_paged
        self.max_ctx_len = max_ctx_len
        common = dict(
            num_heads=num_heads_kv,
            head_dim_k=head_dim_k,
            dtype=dtype,
            head_dim_v=self.head_dim_v,
            max_batch_size=max_batch_size,
            max_seqlen=max_sequence_length,
        )
        if is_paged:
            self.page_size, self.total_num_pages = page_size, total_num_pages
            manager = PagedKVCacheManager if custom_cache_manager is None else custom_cache_manager
            self.cache_manager = manager(total_num_pages=total_num_pages, page_size=page_size, **common)
        else:
            manager = NonPagedKVCacheManager if custom_cache_manager is None else custom_cache_manager
            self.cache_manager = manager(**common)
        self.cache_qkv_format = "bshd"
        self.input_qkv_format = qkv_format
        self.output_qkv_format = self._output_format(qkv_format)
        self.sequences = OrderedDict()
        self.sequences_pre_step = OrderedDict()
        self.batch_size = 0
        # (CPU tensors: the attention reads the lengths on the host anyway.)
        self.cu_seqlens_q = torch.zeros(max_batch_size + 1, dtype=torch.int32)
        self.cu_seqlens_kv = torch.zeros(max_batch_size + 1, dtype=torch.int32)
        self.pre_step_seqlens = torch.zeros(max_batch_size, dtype=torch.int32)

    def _output_format(self, fmt: str) -> str:
        return fmt if fmt == self.cache_qkv_format else f"{fmt}_2{self.cache_qkv_format}"

    def reset(self):
        self.sequences = OrderedDict()
        self.cache_manager.reset()

    def __repr__(self) -> str:
        return (
            f"dtype={self.dtype}, is_paged={self.is_paged}, max_batch_size={self.max_batch_size}, "
            f"max_seqlen={self.max_sequence_length}, num_heads={self.num_heads_kv}, "
            f"head_dim_k={self.head_dim_k}, head_dim_v={self.head_dim_v}"
        )

    def allocate_memory(self, layer_number: int):
        """Creates layer `layer_number`'s cache (on the first keys' device at its first step)."""
        self.cache_manager.cache.setdefault(layer_number, (None, None))

    def pre_step(self, step_dict: OrderedDict):
        """Starts an iteration: step_dict {seq_id: new tokens} in batch order."""
        if len(step_dict) > self.max_batch_size:
            raise ValueError(f"InferenceParams: {len(step_dict)} sequences, max_batch_size is {self.max_batch_size}")
        self.batch_size = len(step_dict)
        self.sequences = self.cache_manager.pre_step(step_dict)
        self.sequences_pre_step = OrderedDict((k, v - step_dict[k]) for k, v in self.sequences.items())
        pre = list(self.sequences_pre_step.values())
        self.pre_step_seqlens.zero_()
        self.pre_step_seqlens[: len(pre)] = torch.tensor(pre, dtype=torch.int32)
        self.cu_seqlens_q.copy_(self._cumulative(list(step_dict.values())))
        self.cu_seqlens_kv.copy_(self._cumulative(list(self.sequences.values())))

    def _cumulative(self, lengths) -> torch.Tensor:
        out = [0]
        for n in lengths:
            out.append(out[-1] + n)
        out += [out[-1]] * (self.max_batch_size - len(lengths))
        return torch.tensor(out, dtype=torch.int32)

    def get_seqlens_pre_step(self) -> torch.Tensor:
        """Cached lengths before this iteration (the RoPE start positions)."""
        return self.pre_step_seqlens[: self.batch_size]

    def step(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str):
        """Copies the new keys/values into the layer's cache. Returns (k_cache,
        v_cache, cu_seqlens_q, cu_seqlens_kv, max_sequence_length, qkv_format)
        with the caches [batch, max_sequence_length, hk, d] and qkv_format
        e.g. "sbhd_2bshd" (queries sbhd, keys/values bshd)."""
        if qkv_format not in _FORMATS:
            raise ValueError(f"InferenceParams.step: qkv_format must be one of {_FORMATS}, got {qkv_format!r}")
        self.input_qkv_format = qkv_format
        self.output_qkv_format = self._output_format(qkv_format)
        b = self.batch_size
        cu_q, cu_kv = self.cu_seqlens_q[: b + 1], self.cu_seqlens_kv[: b + 1]
        k, v = self.cache_manager.step(layer_number, new_k, new_v, cu_q, cu_kv, qkv_format)
        device = new_k.device
        return k, v, cu_q.to(device), cu_kv.to(device), self.max_sequence_length, self.output_qkv_format
