"""Keep the accepted path of a verified tree in a `DynamicCache`.

The verification forward appends the keys/values of all n tree nodes after the cached prefix. Only the
accepted path's nodes belong to the sequence; gathering them back into place right after the prefix
and cropping the rest leaves the cache equal to the one a plain forward over prefix + accepted tokens
would have built (positions are carried by the rotary embedding applied before caching, and every node
was computed with exactly its ancestors visible).
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

__all__ = ["check_tree_cache", "keep_path", "crop_to"]


def check_tree_cache(cache) -> None:
    """Raise a clear error for caches the tree engine cannot compact in place."""
    if not isinstance(cache, DynamicCache):
        kind = type(cache).__name__
        raise ValueError(
            f"tree speculative decoding needs a DynamicCache, got {kind}. Static, quantized and offloaded caches "
            "cannot drop rejected tree nodes; leave `cache_implementation` unset (or pass a DynamicCache)."
        )
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            if isinstance(layer, DynamicSlidingWindowLayer):
                raise ValueError(
                    "tree speculative decoding does not support sliding-window cache layers yet (the window would "
                    "evict prefix tokens while tree nodes are appended); load the model with `sliding_window=None` "
                    "or use a model without sliding-window attention."
                )
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


def crop_to(cache: Cache, length: int) -> None:
    """Crop every layer to ``length`` cached positions (transformers' ``crop``, which takes the count to remove)."""
    for layer in cache.layers:
        if layer.is_initialized:
            excess = layer.get_seq_length() - length
            if excess > 0:
                layer.crop(-excess)
