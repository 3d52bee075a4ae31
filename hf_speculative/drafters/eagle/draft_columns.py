"""Which target token each of an EAGLE drafter's logit columns scores, while it trains and while it is calibrated.

EAGLE-3 with a reduced draft vocabulary (EAGLE-3 Sec. 3.3's ``d2t``) drafts the ``draft_vocab_size`` most frequent
tokens; with ``context_tokens`` (`EagleConfig`) the prompt's tokens outside that vocabulary join it while drafting,
scored by the target's own ``lm_head`` rows, so that a name copied from the prompt stays draftable. Those columns
must be trained as they are used: here each training row gets the columns its drafting would have, the draft
vocabulary then the prompt tokens of its sequence outside it (`context_vocab`), and the teacher's top-k ids are
mapped onto them (`DraftColumns.columns`). EAGLE-1/2 score the target's whole vocabulary: columns are target ids.
"""

from __future__ import annotations

import copy

import torch

__all__ = ["DraftColumns", "context_vocab", "uses_context_tokens"]


def uses_context_tokens(drafter) -> bool:
    """Whether ``drafter`` drafts with context tokens: EAGLE-3, ``context_tokens`` on, a draft vocabulary smaller than
    the target's, and the target's ``lm_head`` attached."""
    config = drafter.config
    return (
        config.is_eagle3
        and config.context_tokens
        and (config.draft_vocab_size or config.vocab_size) < config.vocab_size
        and drafter.base_lm_head is not None
    )


def context_vocab(drafter, batch: dict) -> torch.Tensor | None:
    """``(B, E)``: per sequence of ``batch``, its prompt tokens (``context_ids``, -1 padded) outside the draft
    vocabulary, -1 padded; None when the drafter drafts no context tokens or no sequence has any."""
    if not uses_context_tokens(drafter) or "context_ids" not in batch:
        return None
    ids = batch["context_ids"]
    outside = (ids >= 0) & ~drafter.t2d.to(ids.device)[ids.clamp_min(0)]
    width = int(outside.sum(-1).max()) if ids.numel() else 0
    if width == 0:
        return None
    extra = torch.full((ids.shape[0], width), -1, dtype=torch.long, device=ids.device)
    for b in range(ids.shape[0]):
        kept = ids[b][outside[b]]
        extra[b, : kept.numel()] = kept
    return extra


class DraftColumns:
    """The columns of one unrolled step's logits for its ``M`` rows: the draft vocabulary's ``V_d`` columns, then
    (EAGLE-3 with context tokens) each row's own context tokens ``extra (M, E)`` (-1: an unused column). Build it
    once per batch; `with_extra` gives each step's rows their context tokens without rebuilding the index."""

    def __init__(self, drafter, extra: torch.Tensor | None = None):
        self.drafter = drafter
        self.extra = extra
        self.eagle3 = drafter.config.is_eagle3
        if self.eagle3:
            ids = drafter.draft_target_ids
            self.index = torch.full((drafter.config.vocab_size,), -1, dtype=torch.long, device=ids.device)
            self.index[ids] = torch.arange(ids.numel(), device=ids.device)
            self.draft = ids.numel()

    def with_extra(self, extra: torch.Tensor | None) -> "DraftColumns":
        """The same columns with the rows' context tokens ``extra (M, E)``."""
        out = copy.copy(self)
        out.extra = extra
        return out

    def columns(self, target_ids: torch.Tensor) -> torch.Tensor:
        """``(M, k)`` target ids -> the column scoring each (-1 where the row has none)."""
        if not self.eagle3:
            return target_ids
        cols = self.index.to(target_ids.device)[target_ids]
        if self.extra is None:
            return cols
        match = (target_ids[:, :, None] == self.extra[:, None, :]) & (self.extra[:, None, :] >= 0)
        extra_cols = torch.where(match.any(-1), self.draft + match.int().argmax(-1), -1)
        return torch.where(cols >= 0, cols, extra_cols)

    def target_ids(self, columns: torch.Tensor) -> torch.Tensor:
        """``(M, ...)`` columns -> the target ids they score."""
        if not self.eagle3:
            return columns
        inner = columns < self.draft
        ids = self.drafter.draft_to_target_ids(columns.clamp_max(self.draft - 1))
        if self.extra is None:
            return ids
        flat = columns.reshape(columns.shape[0], -1)
        extra = self.extra.gather(1, (flat - self.draft).clamp(0, self.extra.shape[1] - 1)).reshape(columns.shape)
        return torch.where(inner, ids, extra)
