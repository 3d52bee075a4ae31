"""What the engine checks of a step's drafts, and the logits processors one row's tree nodes run."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

from .trees import DraftTree

__all__ = ["check_drafts", "row_processors"]


def check_drafts(drafter, drafts: list[DraftTree], sequences: list[torch.Tensor], vocab_size: int) -> None:
    """A clear error naming the drafter when a draft's root is not its row's last committed token or a drafted token
    id is outside ``[0, vocab_size)`` (one host read for the whole batch)."""
    if len(drafts) != len(sequences):
        raise ValueError(f"{type(drafter).__name__} returned {len(drafts)} drafts for {len(sequences)} rows")
    roots = torch.stack([d.tokens[0].to("cpu") for d in drafts])
    last = torch.stack([seq[0, -1].to("cpu") for seq in sequences])
    tokens = torch.cat([d.tokens.to("cpu") for d in drafts])
    bad_root, low, high = torch.stack([(roots != last).any(), tokens.min() < 0, tokens.max() >= vocab_size]).tolist()
    name = type(drafter).__name__
    if bad_root:
        row = int((roots != last).nonzero()[0])
        raise ValueError(
            f"{name} drafted a tree for row {row} whose root is token {int(roots[row])}, but the row's last committed "
            f"token is {int(last[row])}: a draft starts at the last token (DraftTree.tokens[0])"
        )
    if low or high:
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
        raise ValueError(
            f"{name} drafted token id {int(bad[0])}, outside the model's vocabulary of {vocab_size} tokens "
            "(a drafter for another tokenizer, or a corrupt drafter file?)"
        )


def row_processors(processors, row: int):
    """``processors`` as they apply to one row's prefixes: a prefix constraint (``prefix_allowed_tokens_fn``) gets the
    row's ``batch_id`` (the engine runs processors on one row at a time, where it would see 0)."""
    if not processors or not any(isinstance(p, PrefixConstrainedLogitsProcessor) for p in processors):
        return processors
    return LogitsProcessorList(
        _for_row(p, row) if isinstance(p, PrefixConstrainedLogitsProcessor) else p for p in processors
    )


def _for_row(processor: PrefixConstrainedLogitsProcessor, row: int) -> PrefixConstrainedLogitsProcessor:
    allowed = processor._prefix_allowed_tokens_fn
    return PrefixConstrainedLogitsProcessor(lambda _batch_id, sent: allowed(row, sent), processor._num_beams)
