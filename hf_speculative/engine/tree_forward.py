"""The verification forward: the engine's one call of the target per decoding step.

A drafter that shapes the verified trees inside that forward (Speculative Streaming's parallel tree pruning,
Sec. 3.1.3) sets `TreeDrafter.pruning_layer` = l and implements `TreeDrafter.prune_batch`. The engine still makes
the one ``model(...)`` call; forward pre-hooks on the decoder layers hand the drafter the state entering layer l
of every row's nodes and apply its answer:

* the kept nodes of every row (padded to the widest row, a padding node sees itself only) continue through
  layers l..N-1, with the attention mask the engine builds for the pruned trees and the kept nodes' positions
  and rotary embeddings;
* layers 0..l-1 have already cached keys/values for every node; their columns are compacted to the kept nodes
  in place, so every layer caches exactly the kept nodes when the forward ends;
* the hidden states recorded before layer l are cut to the kept nodes, so every output the engine and the
  drafter read indexes the pruned trees.

Pruning only removes candidates; every kept node is verified by the full model with exactly its ancestors
visible, so the output does not change.
"""

from __future__ import annotations

from typing import Callable

import torch

from .cache import keep_columns
from .hooks import this_thread_only
from .trees import DraftTree

__all__ = ["verification_forward"]


def verification_forward(
    model, drafter, drafts: list[DraftTree], mask_for: Callable, **inputs
) -> tuple[object, list[DraftTree]]:
    """``model(**inputs)`` over the drafts' nodes; returns the outputs and the drafts they verified (pruned by the
    drafter's hook when it has one). ``mask_for(drafts, position_ids)`` builds the attention mask of pruned drafts."""
    layer = drafter.pruning_layer
    if layer is None:
        return model(**inputs), drafts
    pruning = _Pruning(model, drafter, drafts, mask_for, layer, inputs[_cache_key(inputs)])
    with pruning:
        outputs = model(**inputs)
    return pruning.finish(outputs), pruning.drafts


def _decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (``model.model.layers`` for Llama, Mistral, Qwen2, ...)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(
            f"{type(model).__name__} exposes no decoder layers (model.layers): tree pruning cannot run inside its forward"
        )
    return layers


def _cache_key(inputs: dict) -> str:
    return "cache" if "cache" in inputs else "past_key_values"


class _Pruning:
    """The pre-hooks of one pruned forward (see the module docstring)."""

    def __init__(self, model, drafter, drafts: list[DraftTree], mask_for: Callable, layer: int, cache):
        self.model, self.drafter, self.drafts, self.mask_for = model, drafter, drafts, mask_for
        self.layer, self.cache = layer, cache
        self.layer_types = getattr(model.config, "layer_types", None)
        self.index: torch.Tensor | None = None  # (A, n') kept node of every slot; None: nothing pruned
        self.handles = []

    def __enter__(self):
        layers = _decoder_layers(self.model)
        for i in range(self.layer, len(layers)):
            self.handles.append(layers[i].register_forward_pre_hook(this_thread_only(self._hook(i)), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def _hook(self, i: int):
        def hook(module, args, kwargs):
            if i == self.layer:
                hidden = args[0] if args else kwargs["hidden_states"]
                self._prune(hidden, kwargs)
            if self.index is None:
                return None
            if i == self.layer:
                hidden = self._gather(hidden)
                args, kwargs = ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})
            mask = self.mask
            if isinstance(mask, dict):
                mask = mask[self.layer_types[i]]
            cos, sin = kwargs["position_embeddings"]
            return args, {
                **kwargs,
                "attention_mask": mask,
                "position_ids": self.position_ids,
                "position_embeddings": (self._gather(cos), self._gather(sin)),
            }

        return hook

    def _prune(self, hidden: torch.Tensor, kwargs: dict) -> None:
        """Ask the drafter which nodes stay; build the gather index, the pruned drafts, mask and positions, and
        compact the lower layers' cache."""
        keeps = self.drafter.prune_batch(hidden, self.drafts)
        if keeps is None or all(len(k) == len(d) for k, d in zip(keeps, self.drafts)):
            return
        width = max(len(k) for k in keeps)
        self.index = torch.tensor([list(k) + [0] * (width - len(k)) for k in keeps], device=hidden.device)
        self.drafts = [d.select(list(k)) for d, k in zip(self.drafts, keeps)]
        self.position_ids = self._gather(kwargs["position_ids"].expand(len(keeps), -1))
        # the engine's mask buffer is rebuilt in place for the pruned trees: the layers below have already used the
        # full trees' mask (this runs as layer `pruning_layer` starts), and the layers from here on read the new one
        self.mask = self.mask_for(self.drafts, self.position_ids)
        past = self.cache.get_seq_length() - hidden.shape[1]
        keep_columns(self.cache, past, self.index, num_layers=self.layer)

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` ``(A, n, ...)`` at the kept slots ``(A, n', ...)``."""
        index = self.index.to(tensor.device).view(*self.index.shape, *([1] * (tensor.dim() - 2)))
        return tensor.gather(1, index.expand(-1, -1, *tensor.shape[2:]))

    def finish(self, outputs):
        """Cut the hidden states recorded before the pruning layer to the kept nodes."""
        hidden = getattr(outputs, "hidden_states", None)
        if self.index is not None and hidden:
            outputs.hidden_states = (*(self._gather(h) for h in hidden[: self.layer + 1]), *hidden[self.layer + 1 :])
        return outputs
