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

**Appending in place.** A `DynamicLayer` appends by concatenation: every step copies each layer's whole cache into a
new tensor (about 1 ms of a 40 ms SmolLM2-135M step at 200 cached tokens on two cores, 3 ms at 800, and the same
share of a larger model's step at a longer context). For its own forwards the engine swaps the layers for
`ReservedLayer`, whose keys and values are views of buffers with room for more columns: a step writes its new
columns and nothing else. The layers are swapped back (`release_tree_cache`) before ``generate()`` returns.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

__all__ = [
    "ReservedLayer",
    "attention_window",
    "prepare_tree_cache",
    "release_tree_cache",
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
        if type(layer) in (DynamicLayer, ReservedLayer):
            if convert and type(layer) is DynamicLayer:
                cache.layers[i] = ReservedLayer.taking_over(layer)
            continue
        if type(layer) is DynamicSlidingWindowLayer:
            if layer.is_initialized and layer.cumulative_length > layer.keys.shape[-2]:
                raise ValueError(
                    f"layer {i} of the cache is a DynamicSlidingWindowLayer that already evicted tokens (window "
                    f"{layer.sliding_window}, {layer.cumulative_length} tokens seen): tree speculative decoding keeps the "
                    "whole sequence and applies the window in its masks; start from an empty cache"
                )
            if convert:
                cache.layers[i] = ReservedLayer.taking_over(layer)
            continue
        raise ValueError(f"tree speculative decoding cannot compact cache layers of type {type(layer).__name__}")
    if convert and getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:  # a cache that adds layers lazily
        cache.layer_class_to_replicate = ReservedLayer


def release_tree_cache(cache) -> None:
    """Swap `prepare_tree_cache`'s `ReservedLayer` back for `DynamicLayer` holding the same keys and values (compact
    copies: no buffer's spare room outlives the call), so the caller's cache is the kind it passed in."""
    if not isinstance(cache, DynamicCache):
        return
    for i, layer in enumerate(cache.layers):
        if type(layer) is ReservedLayer:
            cache.layers[i] = layer.released()
    if getattr(cache, "layer_class_to_replicate", None) is ReservedLayer:
        cache.layer_class_to_replicate = DynamicLayer


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` that appends in place: ``keys`` and ``values`` are views of buffers with room for
    `RESERVE_COLUMNS` (or an eighth of the length, whichever is more) further columns, so `update` writes its new
    columns instead of concatenating the whole cache. `crop` narrows the views; whoever replaces ``keys``/``values``
    with other tensors (`batch_select_indices`, offloading, a drafter) is followed: the next `update` copies them into
    new buffers. The values written are the ones `DynamicLayer` would hold, so every forward computes the same."""

    def __init__(self):
        super().__init__()
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._written: tuple[torch.Tensor, torch.Tensor] | None = None  # the views the last `update` returned

    @classmethod
    def taking_over(cls, layer: DynamicLayer) -> "ReservedLayer":
        """A reserved layer holding ``layer``'s keys and values (copied into buffers on the first `update`)."""
        new = cls()
        if layer.is_initialized:
            new.lazy_initialization(layer.keys, layer.values)
            new.keys, new.values = layer.keys, layer.values
        return new

    def released(self) -> DynamicLayer:
        """A plain `DynamicLayer` with this layer's keys and values, copied out of the buffers (compact, no spare room)."""
        plain = DynamicLayer()
        if self.is_initialized:
            plain.lazy_initialization(self.keys, self.values)
            plain.keys, plain.values = self.keys, self.values
            if self._written is not None:  # views of the buffers
                plain.keys, plain.values = (t.clone(memory_format=torch.contiguous_format) for t in self._written)
        return plain

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.keys.shape[-2] if self.keys.dim() > 1 else 0  # a fresh layer holds a 1-D empty tensor
        end = length + key_states.shape[-2]
        if not self._in_buffers() or end > self.buffers[0].shape[-2]:
            self._reserve(length, end, key_states, value_states)
        key_buffer, value_buffer = self.buffers
        key_buffer.narrow(-2, length, end - length).copy_(key_states)
        value_buffer.narrow(-2, length, end - length).copy_(value_states)
        self.keys, self.values = key_buffer.narrow(-2, 0, end), value_buffer.narrow(-2, 0, end)
        self._written = (self.keys, self.values)
        return self.keys, self.values

    def _in_buffers(self) -> bool:
        """Whether ``keys``/``values`` are still the views this layer made (by `update` or `crop`), not tensors
        someone put in their place."""
        written = self._written
        return written is not None and self.keys is written[0] and self.values is written[1]

    def crop(self, tokens_to_remove: int) -> None:
        in_buffers = self._in_buffers()
        super().crop(tokens_to_remove)
        self._written = (self.keys, self.values) if in_buffers else None

    def _reserve(self, length: int, end: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """New buffers for ``end`` columns and the reserve, holding the ``length`` cached ones."""
        columns = end + max(RESERVE_COLUMNS, end // 8)
        buffers = []
        for view, states in ((self.keys, key_states), (self.values, value_states)):
            buffer = states.new_empty((*states.shape[:-2], columns, states.shape[-1]))
            if length:
                buffer[..., :length, :].copy_(view)
            buffers.append(buffer)
        self.buffers = (buffers[0], buffers[1])

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self.buffers = self._written = None  # the selected rows are new tensors: the next update reserves again

    def reset(self) -> None:
        self.buffers = self._written = None
        super().reset()


#: spare columns a `ReservedLayer` keeps past what it holds (at least; an eighth of the length when that is more)
RESERVE_COLUMNS = 128


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
