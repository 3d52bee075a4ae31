"""Keep the accepted paths of verified trees in a `DynamicCache`.

The verification forward appends the keys/values of all n tree nodes (per row, padded to one width) after
the cached prefix. Only each row's accepted path belongs to its sequence; gathering those nodes back into
place right after the prefix and cropping the rest leaves a row's real entries equal to the ones a plain
forward over prefix + accepted tokens would have built (positions are carried by the rotary embedding
applied before caching, and every node was computed with exactly its ancestors visible).

With a batch, rows accept paths of different lengths; every row keeps ``m = max(path lengths)`` columns
and the columns past a shorter row's path are *holes* that the engine's attention masks hide from then on
(`keep_paths`). Sliding-window layers keep the whole sequence here (`prepare_tree_cache`): the engine's
masks apply the window instead, so compaction never meets an evicted column.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

__all__ = [
    "attention_window",
    "prepare_tree_cache",
    "keep_path",
    "keep_paths",
    "keep_columns",
]


def attention_window(config) -> tuple[int | None, str]:
    """``(window, layout)`` of a model's attention: ``(None, "full")`` without sliding windows; ``(w, "all")``
    when every layer slides (Mistral); ``(w, "mapping")`` for a hybrid of full and sliding layers (a
    ``layer_types`` list with ``"sliding_attention"``: Qwen2 ``use_sliding_window``, Gemma-2/3). Other layer
    types (chunked, linear attention) cannot take a tree mask: `ValueError` naming them."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise ValueError(
                f"tree speculative decoding supports full and sliding-window attention layers, not {unknown}"
            )
        if "sliding_attention" not in layer_types or not window:
            return None, "full"
        return int(window), "mapping"  # models built with ``layer_types`` read a {layer type: mask} mapping
    return (int(window), "all") if window else (None, "full")


def prepare_tree_cache(cache, convert: bool = True) -> None:
    """Check ``cache`` and turn its sliding-window layers into full-length layers (in place).

    A `DynamicSlidingWindowLayer` drops keys older than its window as tokens arrive, so after a tree forward
    the columns of the accepted path are no longer at ``past_length + node``; the engine keeps the whole
    sequence in such layers instead and hides keys outside the window with its attention masks (the window
    comes from the model's config, so a `DynamicCache()` built without a config keeps the window too). A
    sliding layer that already evicted tokens (a prefilled cache longer than its window) cannot be converted.
    Static, quantized and offloaded caches cannot drop rejected tree nodes: `ValueError` naming the type.
    """
    if not isinstance(cache, DynamicCache):
        kind = type(cache).__name__
        raise ValueError(
            f"tree speculative decoding needs a DynamicCache, got {kind}. Static, quantized and offloaded caches "
            "cannot drop rejected tree nodes; leave `cache_implementation` unset (or pass a DynamicCache)."
        )
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            continue
        if type(layer) is DynamicSlidingWindowLayer:
            if layer.is_initialized and layer.cumulative_length > layer.keys.shape[-2]:
                raise ValueError(
                    f"layer {i} of the cache is a DynamicSlidingWindowLayer that already evicted tokens (window "
                    f"{layer.sliding_window}, {layer.cumulative_length} tokens seen): tree speculative decoding keeps the "
                    "whole sequence and applies the window in its masks; start from an empty cache"
                )
            if convert:
                full = DynamicLayer()
                if layer.is_initialized:
                    full.lazy_initialization(layer.keys, layer.values)
                    full.keys, full.values = layer.keys, layer.values
                cache.layers[i] = full
            continue
        raise ValueError(f"tree speculative decoding cannot compact cache layers of type {type(layer).__name__}")


def keep_path(cache: Cache, past_length: int, keep: Sequence[int], num_layers: int | None = None) -> None:
    """Keep the tree nodes at offsets ``keep`` (ascending, relative to ``past_length``) and drop the rest,
    in every layer or only in the first ``num_layers`` (a pruned forward whose lower layers saw more nodes)."""
    keep = list(keep)
    contiguous = keep == list(range(len(keep)))
    index = None if contiguous else torch.tensor(keep, dtype=torch.long) + past_length
    on_device: dict[torch.device, torch.Tensor] = {}  # the index copied once per device, not once per layer
    new_length = past_length + len(keep)
    for layer in cache.layers[:num_layers]:
        if not layer.is_initialized:
            continue
        if index is not None:
            device = layer.keys.device
            if device not in on_device:
                on_device[device] = index.to(device)
            idx = on_device[device]
            layer.keys[..., past_length:new_length, :] = layer.keys.index_select(-2, idx)
            layer.values[..., past_length:new_length, :] = layer.values.index_select(-2, idx)
        excess = layer.keys.shape[-2] - new_length
        if excess > 0:
            layer.crop(-excess)


def keep_paths(cache: Cache, past_length: int, paths: Sequence[Sequence[int]]) -> int:
    """`keep_path` per row: row a keeps its nodes ``paths[a]`` (ascending offsets after ``past_length``) in
    columns ``past_length .. past_length + len(paths[a])``; every row keeps ``m = max(len(path))`` columns, the
    ones past a shorter path being holes (repeats of its last node) for the caller to mask. Returns m.
    Rows with the same path share the 1-D fast path of `keep_path`."""
    paths = [list(p) for p in paths]
    m = max(len(p) for p in paths)
    if all(p == paths[0] for p in paths):
        keep_path(cache, past_length, paths[0])
        return m
    keep_columns(cache, past_length, torch.tensor([p + [p[-1]] * (m - len(p)) for p in paths], dtype=torch.long))
    return m


def keep_columns(cache: Cache, past_length: int, index: torch.Tensor, num_layers: int | None = None) -> None:
    """Per row a, move the columns ``past_length + index[a]`` (``index`` ``(A, m)``, offsets after the prefix) into
    place after the prefix, in place, and drop the rest: every layer, or the first ``num_layers`` only."""
    on_device: dict[torch.device, torch.Tensor] = {}  # the index copied once per device, not once per layer
    m = index.shape[1]
    for layer in cache.layers[:num_layers]:
        if not layer.is_initialized:
            continue
        device = layer.keys.device
        if device not in on_device:
            on_device[device] = (index + past_length).to(device)[:, None, :, None]
        idx = on_device[device]
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            gathered = tensor.gather(-2, idx.expand(-1, tensor.shape[1], -1, tensor.shape[-1]))
            tensor[..., past_length : past_length + m, :] = gathered
        excess = layer.keys.shape[-2] - (past_length + m)
        if excess > 0:
            layer.crop(-excess)
