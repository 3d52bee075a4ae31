"""A frequency-truncated draft vocabulary (FR-Spec: Zhao et al., "FR-Spec: Accelerating Large-Vocabulary
Language Models via Frequency-Ranked Speculative Sampling", 2025).

A drafter's vocabulary projection reads a V x H matrix per step, for SmolLM2's 49K tokens the largest
matrix of the model. Most drafted tokens come from a small head of the frequency distribution, so the
drafter can project onto the K most frequent tokens of its training data only (``draft_to_target``: the
target ids of the draft vocabulary, saved with the drafter's weights). The logits are scattered back to
the full vocabulary (-inf outside the draft vocabulary) and mapped ids are target ids: the tree engine and
verification stay on the full vocabulary, so the output does not change; a token outside the draft
vocabulary can only be committed as a bonus token.
"""

from __future__ import annotations

import weakref
from typing import Iterable

import torch

from ..engine.logits import vocab_logits

__all__ = ["frequent_tokens", "draft_vocab_weight", "draft_vocab_logits", "DraftVocabMixin"]


def frequent_tokens(token_ids: torch.Tensor | Iterable, k: int, vocab_size: int | None = None) -> torch.LongTensor:
    """The ``k`` most frequent ids of ``token_ids`` (a tensor, or an iterable of tensors / id lists), ascending
    by id; ties go to the smaller id. Negative ids (``-100`` labels, padding) are skipped. When fewer than k
    ids occur, the most frequent come first and the rest is filled with the smallest unseen ids."""
    if isinstance(token_ids, torch.Tensor):
        chunks = [token_ids.reshape(-1)]
    else:
        chunks = [torch.as_tensor(t, dtype=torch.long).reshape(-1) for t in token_ids]
    ids = torch.cat([c.long().cpu() for c in chunks]) if chunks else torch.zeros(0, dtype=torch.long)
    ids = ids[ids >= 0]
    size = max(int(vocab_size or 0), int(ids.max()) + 1 if ids.numel() else 0, k)
    counts = torch.bincount(ids, minlength=size)
    if vocab_size is not None and k > vocab_size:
        raise ValueError(f"a draft vocabulary of {k} tokens is larger than the vocabulary ({vocab_size})")
    # stable sort by descending count keeps ascending ids among equal counts
    order = torch.sort(counts, descending=True, stable=True).indices[:k]
    return order.sort().values


class _SlicedRows:
    """The rows of one weight an id map selected, kept on the id map tensor (`draft_vocab_weight`); copies and
    pickles of the tensor start empty (the rows are computed again)."""

    def __init__(self, weight: torch.Tensor | None = None, key: tuple = (), rows: torch.Tensor | None = None):
        self.weight = weakref.ref(weight) if weight is not None else None
        self.key, self.rows = key, rows

    def get(self, weight: torch.Tensor, key: tuple) -> torch.Tensor | None:
        return self.rows if self.weight is not None and self.weight() is weight and self.key == key else None

    def __reduce__(self):
        return (_SlicedRows, ())

    def __deepcopy__(self, memo):
        return _SlicedRows()


def draft_vocab_weight(weight: torch.Tensor, draft_to_target: torch.Tensor) -> torch.Tensor:
    """``weight[draft_to_target]``, computed once per (weight, id map) and reused while neither changes (a
    frozen shared ``lm_head``); a copy per step would cost more than the projection it saves. Pass the
    persistent tensors (the ``lm_head`` parameter, the drafter's ``draft_to_target`` buffer), not fresh views:
    the rows are kept on the id map tensor itself and checked against the weight object, so a new view per call
    would slice the 49K-row table every step."""
    key = (weight._version, weight.device, weight.dtype, draft_to_target._version, draft_to_target.device)
    cached = getattr(draft_to_target, "_hfs_sliced", None)
    rows = cached.get(weight, key) if cached is not None else None
    if rows is None:
        with torch.no_grad():
            rows = weight.detach().index_select(0, draft_to_target.to(weight.device)).contiguous()
        draft_to_target._hfs_sliced = _SlicedRows(weight, key, rows)
    return rows


def draft_vocab_logits(states: torch.Tensor, weight: torch.Tensor, draft_to_target: torch.Tensor) -> torch.Tensor:
    """`vocab_logits` on the draft vocabulary's rows of ``weight`` (the full ``(V, H)`` projection), scattered
    back to ``(..., V)`` with -inf outside the draft vocabulary."""
    small = vocab_logits(states, draft_vocab_weight(weight, draft_to_target))
    full = small.new_full((*small.shape[:-1], weight.shape[0]), float("-inf"))
    return full.index_copy_(-1, draft_to_target.to(small.device), small)


class DraftVocabMixin:
    """The draft vocabulary of a drafter `PreTrainedModel` whose config has ``draft_vocab_size`` and
    ``vocab_size``: the ``draft_to_target`` buffer (saved with the weights) and `set_draft_vocab`."""

    def _init_draft_vocab(self) -> None:
        """Call in ``__init__``: a placeholder buffer of the config's size (the checkpoint fills it)."""
        if self.config.draft_vocab_size:
            self.register_buffer("draft_to_target", torch.arange(self.config.draft_vocab_size), persistent=True)
        else:
            self.draft_to_target = None

    def set_draft_vocab(self, draft_to_target: torch.Tensor | None) -> None:
        """Draft on a truncated vocabulary: ``draft_to_target`` are the target ids to project onto when drafting
        (e.g. ``frequent_tokens(training_ids, 16384)``); None restores the full vocabulary. Stored in
        ``config.draft_vocab_size`` and the ``draft_to_target`` buffer."""
        if draft_to_target is None:
            self._buffers.pop("draft_to_target", None)
            self.draft_to_target = None
            self.config.draft_vocab_size = None
            return
        vocab = self.config.vocab_size
        ids = torch.as_tensor(draft_to_target, dtype=torch.long).reshape(-1)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != ids.numel():
            raise ValueError(f"draft_to_target must hold distinct token ids in 0..{vocab - 1}")
        if "draft_to_target" not in self._buffers:
            del self.draft_to_target
        param = next(self.parameters(), None)
        self.register_buffer("draft_to_target", ids.to(param.device if param is not None else "cpu"), persistent=True)
        self.config.draft_vocab_size = ids.numel()

    @property
    def draft_vocab_share(self) -> float:
        """The share of the vocabulary projection a drafting step reads (1.0 without a draft vocabulary)."""
        return (self.config.draft_vocab_size or self.config.vocab_size) / self.config.vocab_size
