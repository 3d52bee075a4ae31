"""Chains drafted one token per forward (SPIRe, MagicDec): a static tree filled from the chain, and the batched
drafting of per-row chain states."""

from __future__ import annotations

import torch

from ..engine.protocol import OneRowDrafter
from ..engine.trees import DraftingOptions, DraftTree, TreeSpec, fill_children

__all__ = ["chain_nodes", "ChainTreeFiller", "ChainDrafting"]


def chain_nodes(tree: TreeSpec) -> list[int] | None:
    """The chain of a `chain_with_alternatives`-shaped tree: node ids of the root and its rank-0 descendants, when
    those are the tree's only inner nodes; None for another shape."""
    chain = [0]
    while True:
        kids = tree.children[chain[-1]]
        first = [c for c in kids if tree.ranks[c] == 0]
        if not first or not tree.children[first[0]]:
            break
        chain.append(first[0])
    inner = {i for i, kids in enumerate(tree.children) if kids}
    return chain if inner <= set(chain) else None


class ChainTreeFiller:
    """Fills one row's static tree from a chain drafted one token per forward (SPIRe's and MagicDec's drafting).

    For a `chain_with_alternatives`-shaped tree (a chain, or a chain with siblings as leaves) the chain node at depth
    d gets its children from its own distribution: its top-i (greedy) or draws from it (sampling; the chain goes on
    with the first draw), q kept per node for exact tree rejection sampling. Another shape is filled from the chain's
    per-depth distributions by `TreeSpec.fill` (the chain goes on with each depth's argmax).

    Usage: for d in ``range(filler.num_forwards)``, ``next_token = filler(d, logits)`` with the chain node's logits
    ``(vocab,)``; then ``filler.draft_tree()``.
    """

    def __init__(
        self, sequence: torch.LongTensor, tree: TreeSpec, scheme: str, options: DraftingOptions, vocab_size: int
    ):
        self.sequence, self.tree, self.scheme, self.options = sequence, tree, scheme, options
        self.chain = chain_nodes(tree)
        self.rows: list[torch.Tensor] = []
        if self.chain is None:
            self.num_forwards = tree.depth
            return
        self.num_forwards = len(self.chain)
        self.tokens = torch.empty(tree.num_nodes + 1, dtype=torch.long, device=sequence.device)
        self.tokens[0] = sequence[0, -1]
        self.probs = (
            None if scheme == "deterministic" else torch.zeros(tree.num_nodes + 1, vocab_size, device=sequence.device)
        )

    def __call__(self, d: int, logits: torch.Tensor) -> torch.Tensor:
        """Depth d's chain node's logits; returns the chain's token at depth d + 1."""
        if self.chain is None:
            self.rows.append(logits)
            return logits.argmax()
        tree = self.tree
        kids = list(tree.children[self.chain[d]])
        chosen, q = fill_children(logits, 1 + max(tree.ranks[kid] for kid in kids), self.scheme, self.options)
        for kid in kids:
            self.tokens[kid] = chosen[tree.ranks[kid]]
        if self.probs is not None:
            self.probs[self.chain[d]] = q.to(self.probs.device)
        return chosen[0]

    def draft_tree(self) -> DraftTree:
        if self.chain is None:
            return self.tree.fill(torch.stack(self.rows), self.sequence[0, -1], self.scheme, self.options)
        return DraftTree.from_spec(self.tree, self.tokens, draft_probs=self.probs, sampling=self.scheme)


class ChainDrafting(OneRowDrafter):
    """A drafter with one state per row (``begin`` / ``advance`` / ``end``, run once per row by `OneRowDrafter`) that
    drafts every row's chain in one batched forward per depth (SPIRe, MagicDec): ``propose_batch``, its only drafting
    path (B = 1 included), calls its ``_propose(states, sequences, tree, options)`` with the rows' drafters."""

    def propose_batch(self, sequences, rows, tree, options) -> list[DraftTree]:
        return self._propose([self.row_drafter(r) for r in rows], sequences, tree, options)
