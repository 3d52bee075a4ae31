"""`resolve_drafter`: the `TreeDrafter` for one ``generate()`` call, from what the user passed as ``assistant_model``."""

from __future__ import annotations

import torch

from ..registry import drafter_entries
from .placement import match_target
from .protocol import TreeDrafter

__all__ = ["resolve_drafter"]


def _vocab_size(model) -> int | None:
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return emb.weight.shape[0] if emb is not None else getattr(model.config, "vocab_size", None)


def _adapted(target, assistant_model) -> TreeDrafter:
    """The drafter a registered assistant adapter makes of ``assistant_model`` (`hf_speculative.registry`; the
    library's own wraps any causal LM); a `TypeError` when none does."""
    for entry in drafter_entries():
        if entry.assistant is not None:
            drafter = entry.load(entry.assistant)(target, assistant_model)
            if drafter is not None:
                return drafter
    raise TypeError(
        f"assistant_model must be an hf_speculative drafter, a TreeDrafter or a causal LM, got {type(assistant_model).__name__}"
    )


def resolve_drafter(target, assistant_model) -> TreeDrafter | None:
    """The `TreeDrafter` for one call: from a drafter model, a `TreeDrafter`, or any causal LM; None if none.

    A drafter model (or causal LM) of another dtype or device than ``target`` is moved to the target's first
    (`match_target`: the one rule, with a warning line)."""
    if assistant_model is None:
        self_drafter = getattr(target, "get_self_drafter", None)
        return _owned(self_drafter(), target) if self_drafter is not None else None
    if isinstance(assistant_model, torch.nn.Module):
        match_target(assistant_model, target)
    if isinstance(assistant_model, TreeDrafter):
        drafter = assistant_model
    elif hasattr(assistant_model, "get_tree_drafter"):
        drafter = _owned(assistant_model.get_tree_drafter(target), assistant_model)
    else:
        drafter = _owned(_adapted(target, assistant_model), assistant_model)
    target_vocab = _vocab_size(target)
    draft_vocab = drafter.capabilities.vocab_size
    if draft_vocab is not None and target_vocab is not None and draft_vocab != target_vocab:
        raise ValueError(
            f"vocabulary mismatch: the target predicts {target_vocab} tokens but the drafter {draft_vocab}; "
            "tree speculative decoding needs a drafter with the target's vocabulary"
        )
    return drafter


def _owned(drafter: TreeDrafter, owner) -> TreeDrafter:
    """``drafter``, made for this call from ``owner`` (a drafter model, a causal LM, a self-drafting target), which keeps
    its step prices across calls: a short generation then starts from what the earlier calls measured."""
    drafter.pricing_owner = owner
    return drafter
