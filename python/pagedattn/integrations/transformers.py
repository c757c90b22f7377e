"""pagedattn as an attention backend of Hugging Face Transformers' continuous batching.

    import pagedattn.integrations.transformers as pa_tf
    pa_tf.register()                                     # once per process
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="pagedattn")
    outputs = model.generate_batch(prompts, generation_config)

``register()`` adds the attention function under the name ``"pagedattn"`` to Transformers'
``AttentionInterface`` (``"paged|pagedattn"`` works too: Transformers strips the ``paged|``
prefix) and teaches the continuous-batching engine to keep it. In a continuous-batching forward
pass the attention of each full-attention layer then runs on Transformers' own paged cache, in
place:

- the layer's pages are the cache, ``kv_layout="NHD"``: Transformers stores a page of a layer as
  ``[page_size, num_kv_heads, head_dim]``, K and V of a layer in consecutive pages, and hands out
  the views ``[num_pages, page_size, num_kv_heads, head_dim]`` of both (the views its own
  block-table path passes to flash-attention); they are the caches, without a copy;
- a token's row in those views is its slot: the engine's ``write_index`` is the slot mapping of
  ``write_cache`` for the new tokens' K/V;
- the engine's ``read_index`` (or ``write_index`` when nothing is read) lists each sequence's
  slots in order; its entries at the starts of pages, divided by ``page_size``, are the block
  table;
- ``cu_seq_lens_q`` is ``q_indptr`` (prefill chunks and decode tokens in one batch, each query
  token causal over its context), ``diff(cu_seq_lens_k)`` the context lengths;
- ``scaling``, ``sliding_window`` (``window_left = sliding_window - 1``), ``softcap`` and the
  per-head attention sinks (``s_aux``, gpt-oss's ``sinks``) map onto ``decode``'s arguments.

Sliding-window layers keep their cache in a ring buffer of ``sliding_window`` slots, which a
block table cannot describe for a chunk of several query tokens (the chunk's writes overwrite
keys its first tokens still see). Their cache update stays Transformers' own: it gathers the
window and the new tokens into dense K/V, which pagedattn reads in place as a cache of one-token
blocks. Outside continuous batching (a plain ``generate`` with a ``DynamicCache``, a forward pass
without a cache) there is no paged cache, and the call goes to Transformers' SDPA attention.

Tested with the Transformers version pinned in pyproject.toml's ``transformers`` extra; register()
refuses Transformers releases without the continuous-batching cache it maps.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

import pagedattn

NAME = "pagedattn"

# Names the engine keeps for continuous batching and the cache update serves in place.
_names: set = set()
_installed = False


def _transformers() -> Any:
    try:
        import torch  # noqa: F401
        import transformers
        from transformers import AttentionInterface
        from transformers.generation.continuous_batching import cache as cb_cache
        from transformers.generation.continuous_batching import continuous_api
        from transformers.generation.continuous_batching.cache_allocators import (
            FullAttentionCacheAllocator,
        )
    except ImportError as e:
        raise ImportError(
            "pagedattn.integrations.transformers needs PyTorch and a Transformers release with "
            f"continuous batching (pip install 'pagedattn[transformers]'): {e}"
        ) from e
    return transformers, AttentionInterface, cb_cache, continuous_api, FullAttentionCacheAllocator


def register(name: str = NAME) -> str:
    """Registers pagedattn as Transformers attention implementation ``name`` and returns the name.

    Load a model with ``attn_implementation=name`` (or ``"paged|" + name``), or switch one with
    ``model.set_attn_implementation(name)``, and run ``generate_batch`` or
    ``transformers serve --continuous_batching``. Calling it again is harmless.
    """
    if not isinstance(name, str) or not name or name.startswith("paged|") or "flash" in name:
        # Transformers strips "paged|" itself and treats any name containing "flash" as a
        # flash-attention kernel to import.
        raise _error(
            f"name = {name!r}: must be a non-empty string without the 'paged|' prefix and "
            "without 'flash'", "name")
    _, AttentionInterface, cb_cache, continuous_api, full_cls = _transformers()
    AttentionInterface.register(name, attention_forward)
    _names.add(name)
    _install(cb_cache, continuous_api, full_cls)
    return name


def _install(cb_cache: Any, continuous_api: Any, full_cls: Any) -> None:
    """Wraps the two places of the engine that decide by the implementation's name.

    Both wrappers change nothing for any other implementation, and are installed once."""
    global _installed
    if _installed:
        return
    cache_cls = cb_cache.PagedAttentionCache
    manager_cls = continuous_api.ContinuousBatchingManager
    for cls, attr in ((cache_cls, "update"), (manager_cls, "switch_to_cb_friendly_attn")):
        if not callable(getattr(cls, attr, None)):
            raise _error(
                f"transformers: {cls.__name__}.{attr} is missing; this Transformers release is not "
                "one the integration supports (see pyproject.toml's transformers extra)",
                "transformers")

    switch = manager_cls.switch_to_cb_friendly_attn

    @functools.wraps(switch)
    def switch_to_cb_friendly_attn(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
        # The engine accepts "sdpa", "paged|eager" and flash kernels by name and refuses the
        # rest; pagedattn needs no switch (it runs on the engine's varlen inputs, like flash,
        # and reads no attention mask).
        if model.config._attn_implementation in _names:
            return None
        return switch(self, model, *args, **kwargs)

    update = cache_cls.update

    @functools.wraps(update)
    def cache_update(self: Any, key_states: Any, value_states: Any, layer_idx: int,
                     kwargs: dict) -> Tuple[Any, Any]:
        allocator = self.layer_to_allocator[layer_idx]
        # Only a full-attention layer (not its MLA or sliding-window subclasses) in the engine's
        # index path is served in place; everything else is the engine's own update.
        if (self.config._attn_implementation not in _names or type(allocator) is not full_cls
                or kwargs.get("block_table") is not None or "write_index" not in kwargs):
            return update(self, key_states, value_states, layer_idx, kwargs)
        # As the engine's update does: this layer type's key lengths (the kwargs are the layer's
        # own dict, built by its forward's **kwargs).
        kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"][allocator.layer_type].to(_torch().int32)
        kwargs["max_length_k"] = kwargs["max_length_k"][allocator.layer_type]
        k_pages, v_pages = allocator.get_cache_for_block_table(layer_idx)
        kwargs["pagedattn_cache"] = _PagedLayer(
            k_pages, v_pages, kwargs["write_index"][allocator.index],
            kwargs["read_index"][allocator.index])
        # The new tokens' K/V go to the cache in the attention call (write_cache), not here.
        return key_states, value_states

    # The engine's update is excluded from torch.compile (the cache's views); so is this one.
    cache_update = _torch().compiler.disable(cache_update)
    cache_cls.update = cache_update
    manager_cls.switch_to_cb_friendly_attn = switch_to_cb_friendly_attn
    _installed = True


def _error(message: str, argument: str, code: str = "invalid_argument") -> pagedattn.Error:
    return pagedattn.Error("pagedattn: " + message, argument, code)


def _torch() -> Any:
    import torch
    return torch


class _PagedLayer:
    """One full-attention layer's view of the engine's cache for one forward pass."""

    __slots__ = ("k_pages", "v_pages", "write_index", "read_index")

    def __init__(self, k_pages: Any, v_pages: Any, write_index: Any, read_index: Any) -> None:
        self.k_pages = k_pages          # [num_pages, page_size, num_kv_heads, head_dim]
        self.v_pages = v_pages
        self.write_index = write_index  # [num_q_tokens] int64: each new token's row (slot)
        self.read_index = read_index    # [sum of context lengths] int64, or empty


def _token_rows(x: Any, name: str) -> Tuple[Any, bool]:
    """[1, heads, tokens, dim] as [tokens, heads, dim] with each token's row contiguous.

    Transformers computes q, k, v as [1, tokens, heads * dim] projections viewed as
    [1, heads, tokens, dim] by a transpose, and RoPE keeps that memory layout, so the view is
    free; any other layout is copied once (the second value says so)."""
    if x.dim() != 4 or x.shape[0] != 1:
        raise _error(
            f"{name}.shape = {tuple(x.shape)}: continuous batching passes [1, heads, tokens, dim]",
            name)
    rows = x[0].transpose(0, 1)
    if rows.stride(2) == 1 and rows.stride(1) == rows.shape[2]:
        return rows, False
    return rows.contiguous(), True


def _variants(module: Any, scaling: Optional[float], sliding_window: Optional[int],
              softcap: Optional[float], s_aux: Any, num_heads: int) -> dict:
    torch = _torch()
    args = {}
    if scaling is not None:
        args["scale"] = float(scaling)
    if sliding_window is not None:
        if int(sliding_window) < 1:
            raise _error(f"sliding_window = {sliding_window}: must be >= 1",
                                  "sliding_window")
        # Transformers' window counts the query's own token: W tokens are t > P - W.
        args["window_left"] = int(sliding_window) - 1
    if softcap is not None and float(softcap) != 0.0:
        args["logits_soft_cap"] = float(softcap)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    if sinks is not None:
        sinks = sinks.detach()
        if tuple(sinks.shape) != (num_heads,):
            raise _error(
                f"sinks.shape = {tuple(sinks.shape)}: must be [num_heads] = [{num_heads}]", "sinks")
        # pagedattn takes the sinks in f32; a model in bf16 or f16 keeps them in its dtype, so
        # those [num_heads] values are converted (f32 models pass theirs as they are).
        args["sinks"] = sinks.to(torch.float32).contiguous()
    return args


def attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      s_aux: Any = None, **kwargs: Any) -> Tuple[Any, None]:
    """Transformers' attention-function signature: query [1, H, T, D], key and value
    [1, KV, T or N, D]; returns ([1, T, H, D], None)."""
    torch = _torch()
    layer = kwargs.pop("pagedattn_cache", None)
    cu_q = kwargs.get("cu_seq_lens_q")
    cu_k = kwargs.get("cu_seq_lens_k")
    if cu_q is None or not isinstance(cu_k, torch.Tensor):
        # Not a continuous-batching pass: no paged cache to read.
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        if softcap is not None or s_aux is not None or getattr(module, "sinks", None) is not None:
            raise _error(
                "attn_implementation='pagedattn' outside continuous batching falls back to SDPA, "
                "which has no soft-cap or sinks: use generate_batch, or load the model with "
                "another implementation for plain generate", "attn_implementation")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, sliding_window=sliding_window, **kwargs)
    if dropout:
        raise _error(f"dropout = {dropout}: pagedattn is inference only", "dropout")
    if kwargs.get("block_table") is not None:
        raise _error(
            "block_table: the engine's flash-only decode path is not served by pagedattn "
            "(it is never chosen for attn_implementation='pagedattn')", "block_table")

    num_heads, head_dim = query.shape[1], query.shape[3]
    if value.shape[3] != head_dim or key.shape[3] != head_dim:
        raise _error(
            f"value.shape = {tuple(value.shape)}: pagedattn needs the K and V head dim to equal "
            f"the query's ({head_dim})", "value")
    q, _ = _token_rows(query, "query")
    q_indptr = cu_q.to(torch.int32)
    num_q = q.shape[0]
    # A padded batch (static shapes, for CUDA graphs) has query rows past the last sequence's;
    # q_indptr must end at q's row count, so the rows are counted (on a GPU, a synchronization).
    total_q = int(q_indptr[-1]) if q_indptr.shape[0] > 1 else 0
    if total_q != num_q:
        q = q[:total_q]
    context_lens = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    max_q_len = max(1, int(kwargs.get("max_length_q") or 1))
    variants = _variants(module, scaling, sliding_window, softcap, s_aux, num_heads)

    if layer is not None:
        # Full attention on the engine's pages: write the new tokens, then read in place.
        k_new, _ = _token_rows(key, "key")
        v_new, _ = _token_rows(value, "value")
        slots = layer.write_index.to(torch.int32)
        pagedattn.write_cache(k_new, v_new, slots, layer.k_pages, layer.v_pages, kv_layout="NHD")
        page_size = layer.k_pages.shape[1]
        rows = layer.read_index if layer.read_index.numel() > 0 else layer.write_index
        block_table = _block_table(rows, cu_k, int(kwargs.get("max_length_k") or 0), page_size)
        k_cache, v_cache = layer.k_pages, layer.v_pages
    else:
        # The engine's own update gathered each sequence's context into dense K/V
        # [1, KV, N, D] (a sliding window, or another cache type): read in place as a cache of
        # one-token blocks, sequence b's tokens at rows cu_seq_lens_k[b] onwards.
        k_rows, _ = _token_rows(key, "key")
        v_rows, _ = _token_rows(value, "value")
        k_cache, v_cache = k_rows.unsqueeze(1), v_rows.unsqueeze(1)
        max_len = int(kwargs.get("max_length_k") or 0)
        block_table = (cu_k[:-1, None].to(torch.int32)
                       + torch.arange(max(1, max_len), dtype=torch.int32, device=cu_k.device))
        block_table = torch.minimum(block_table, torch.tensor(max(0, k_rows.shape[0] - 1),
                                                              dtype=torch.int32,
                                                              device=cu_k.device))

    out = torch.zeros(num_q, num_heads, head_dim, dtype=q.dtype, device=q.device)
    pagedattn.decode(q, k_cache, v_cache, block_table, context_lens, out=out[:total_q],
                     q_indptr=q_indptr, max_q_len=max_q_len, kv_layout="NHD", **variants)
    return out.unsqueeze(0), None


def _block_table(rows: Any, cu_k: Any, max_length_k: int, page_size: int) -> Any:
    """The block table from a list of each sequence's slots in order.

    Sequence b's token t sits at rows[cu_k[b] + t]; a page starts at a multiple of page_size, so
    the entry at t = j * page_size, divided by page_size, is the sequence's j-th page. Entries
    past a sequence's last page are 0 and never read."""
    torch = _torch()
    num_pages = max(1, -(-max_length_k // page_size))
    starts = cu_k[:-1, None].to(torch.int64) + torch.arange(
        num_pages, dtype=torch.int64, device=cu_k.device) * page_size
    valid = starts < cu_k[1:, None]
    starts = torch.clamp(starts, max=max(0, rows.numel() - 1))
    pages = torch.div(rows[starts], page_size, rounding_mode="floor") if rows.numel() else starts
    return torch.where(valid, pages, torch.zeros_like(pages)).to(torch.int32)
