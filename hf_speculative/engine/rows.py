"""The engine's views of the target's batched outputs for drafters: `TargetRows` hands each drafter row a batch-1
view of one verification (or prefill) forward, whose cache shows that row's real tokens only (the engine's shared
cache holds left padding and the holes of shorter accepted paths, see `hf_speculative.engine.cache`).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

__all__ = ["TargetRows", "cache_columns"]


class _RowCacheLayer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]


class _RowCache:
    """Read-only batch-1 view of one row of a batched cache: the row's real tokens only (padding and the
    holes of shorter accepted paths removed), gathered per layer on first access. The view holds the layers'
    tensors as they were when it was made, so a drafter may read it later in the call (when it drafts): the engine's
    later row selection and cache updates make new tensors and leave these as they are."""

    def __init__(self, cache: Cache, row: int, columns: torch.Tensor | None):
        self.row, self._columns, self._index = row, columns, None
        self._tensors = [(getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in cache.layers]
        self._layers: dict[int, _RowCacheLayer] = {}

    @property
    def index(self) -> torch.Tensor | None:
        """The row's real columns among the cached ones (None: every column)."""
        if self._index is None and self._columns is not None:
            self._index = self._columns.nonzero().squeeze(-1)
        return self._index

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if self._columns is not None:
            return int(self.index.shape[0])
        keys = self._tensors[layer_idx][0] if self._tensors else None
        return 0 if keys is None else keys.shape[-2]

    @property
    def layers(self):
        view = self

        class _Layers:
            def __len__(self):
                return len(view._tensors)

            def __getitem__(self, i):
                if i not in view._layers:
                    keys, values = view._tensors[i]
                    keys, values = keys[view.row : view.row + 1], values[view.row : view.row + 1]
                    if view.index is not None:
                        idx = view.index.to(keys.device)
                        keys, values = keys.index_select(-2, idx), values.index_select(-2, idx)
                    view._layers[i] = _RowCacheLayer(keys, values)
                return view._layers[i]

        return _Layers()


class _RowOutputs:
    """A batch-1 view of one row of a batched model output (see `TargetRows.row`)."""

    def __init__(self, outputs, row: int, start: int, columns: torch.Tensor | None):
        self._outputs, self._row, self._start, self._columns = outputs, row, start, columns
        self._seen: dict[str, object] = {}
        name = _cache_name(outputs)
        if name is not None:  # the cache's tensors as they are now (see `_RowCache`): a drafter may read it later
            self._seen[name] = _RowCache(getattr(outputs, name), row, columns)

    def _slice(self, value):
        if isinstance(value, torch.Tensor):
            return value[self._row : self._row + 1, self._start :] if value.dim() >= 2 else value
        if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return type(value)(self._slice(v) for v in value)
        if isinstance(value, Cache):
            return _RowCache(value, self._row, self._columns)
        return value

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._seen:
            self._seen[name] = self._slice(getattr(self._outputs, name))
        return self._seen[name]

    def __getitem__(self, name: str):
        return getattr(self, name)


class TargetRows:
    """The target's outputs of one batched forward, and a batch-1 view per row for the drafters.

    Args:
        outputs: the model output (batch ``A`` rows).
        rows: for each entry j handed to a drafter, its row in ``outputs`` (default: all rows in order).
        starts: per entry, the first position that belongs to the row (its left padding on the prefill).
        columns: ``(A, C)`` bool, which columns of the outputs' cache hold each row's real tokens
            (None: every column).
        top_k: per entry, the ids of the ``TreeDrafter.verified_top_k`` most likely next tokens at each of the
            row's positions, ``(n_j, k)`` long, from the logits this forward computed: the prompt's real
            positions on the prefill, the row's tree nodes (node order) on a verification. None when the
            drafter asked for none.
    """

    def __init__(
        self,
        outputs,
        rows: list[int] | None = None,
        starts: list[int] | None = None,
        columns: torch.Tensor | None = None,
        top_k: list[torch.Tensor] | None = None,
    ):
        self.outputs = outputs
        self.rows = list(range(_batch_size(outputs))) if rows is None else list(rows)
        self.starts = starts if starts is not None else [0] * len(self.rows)
        self.columns = columns
        self.top_k = top_k

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, j: int):
        """Entry j as a batch-1 output, with ``top_k`` its own ``(n_j, k)`` tensor (None when not asked for). With a
        single-row forward, nothing to strip and no top-k: the outputs themselves."""
        i, start = self.rows[j], self.starts[j]
        columns = None if self.columns is None else self.columns[i]
        whole = _batch_size(self.outputs) == 1 and start == 0 and (columns is None or bool(columns.all()))
        if whole and self.top_k is None:
            return self.outputs
        view = _RowOutputs(self.outputs, i, start, None if whole else columns)
        view.top_k = None if self.top_k is None else self.top_k[j]
        return view


def _cache_name(outputs) -> str | None:
    for name in ("cache", "past_key_values"):
        if isinstance(getattr(outputs, name, None), Cache):
            return name
    return None


def _batch_size(outputs) -> int:
    for name in ("logits", "hidden_states"):
        value = getattr(outputs, name, None)
        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            return value.shape[0]
    return 1


def cache_columns(cache, columns: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the keys and values ``(B, kv_heads, len(columns), head_dim)`` of the cached tokens ``columns``
    (indices among the cached tokens). For a batch-1 row view of a batched cache (`TargetRows.row`) the indices count
    the row's real tokens, and only those columns are gathered (not the whole row)."""
    if isinstance(cache, _RowCache):
        tensors, rows = cache._tensors, slice(cache.row, cache.row + 1)
        if cache.index is not None:
            columns = cache.index[columns.to(cache.index.device)]
    else:
        tensors, rows = [(layer.keys, layer.values) for layer in cache.layers], slice(None)
    out, on_device = [], {}
    for keys, values in tensors:
        device = keys.device
        if device not in on_device:
            on_device[device] = columns.to(device)
        idx = on_device[device]
        out.append((keys[rows].index_select(-2, idx), values[rows].index_select(-2, idx)))
    return out
