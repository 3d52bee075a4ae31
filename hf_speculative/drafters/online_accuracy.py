"""Acceptance measured online: per tree depth and sibling rank, how often a drafted node is the target's token.

A tree step tells, for every node whose parent lies on the committed path, whether the node itself was right:
the committed tokens (accepted drafts plus the bonus token) are the target's own continuation, so a node at depth
d is *tried* when its parent's path equals the first d - 1 committed tokens and d does not pass them, and it
*hits* when its token is the d-th committed token. Nodes below a wrong parent, and nodes deeper than the committed
tokens, teach nothing and are not counted.

``accuracy()`` is the table ``acc[d][r]`` (depth d + 1, rank r) that `TreeSpec.optimize` and Medusa's tree
construction (Sec. 2.3.3) take: the chance that the rank-r candidate below a correct parent is correct. Each cell
starts from a prior worth ``prior_weight`` observations and moves to the measured rate as trials accumulate.
"""

from __future__ import annotations

import torch

from ..engine.trees import DraftTree

__all__ = ["OnlineAccuracy", "sibling_ranks"]


def sibling_ranks(draft: DraftTree) -> list[int]:
    """Each node's rank among its parent's children (their order in the draft); the root's is 0."""
    ranks = [0] * len(draft)
    for kids in draft.children:
        for r, kid in enumerate(kids):
            ranks[kid] = r
    return ranks


class OnlineAccuracy:
    """Hits and trials per (depth, rank), with a prior (see the module docstring).

    Args:
        max_depth: depths counted (deeper nodes are ignored).
        max_rank: ranks counted per depth.
        prior: ``prior[r]``, the assumed chance of rank r before any observation (the same at every depth).
        prior_weight: how many observations the prior is worth.
    """

    def __init__(self, max_depth: int, max_rank: int, prior: list[float], prior_weight: float = 8.0):
        if len(prior) < max_rank:
            raise ValueError(f"need a prior for each of the {max_rank} ranks, got {len(prior)}")
        self.prior = torch.tensor(prior[:max_rank], dtype=torch.float64)
        self.prior_weight = float(prior_weight)
        self.hits = torch.zeros(max_depth, max_rank, dtype=torch.float64)
        self.trials = torch.zeros(max_depth, max_rank, dtype=torch.float64)

    @property
    def max_depth(self) -> int:
        return self.hits.shape[0]

    @property
    def max_rank(self) -> int:
        return self.hits.shape[1]

    def accuracy(self) -> list[list[float]]:
        """``acc[d][r]``: (hits + prior x weight) / (trials + weight)."""
        w = self.prior_weight
        return ((self.hits + w * self.prior) / (self.trials + w)).tolist()

    def observe_ranks(self, depth: int, rank: int | None, num_ranks: int | None = None) -> None:
        """One observation at ``depth`` (1-based) where every rank up to ``num_ranks`` was a candidate: the hit is at
        ``rank`` (None: no candidate was right)."""
        if not 1 <= depth <= self.max_depth:
            return
        upto = self.max_rank if num_ranks is None else min(num_ranks, self.max_rank)
        self.trials[depth - 1, :upto] += 1
        if rank is not None and rank < upto:
            self.hits[depth - 1, rank] += 1

    def observe_tree(self, draft: DraftTree, committed: list[int]) -> None:
        """Count every node of ``draft`` whose parent was on the committed path (``committed``: the step's committed
        tokens, accepted drafts then the bonus token)."""
        tokens = draft.tokens.tolist()
        ranks = sibling_ranks(draft)
        on_path = {0}  # nodes whose path equals the committed prefix of their depth
        for node in range(1, len(draft)):
            parent = draft.parents[node]
            if parent not in on_path:
                continue
            depth = len(draft.path_to(node)) - 1
            if depth > len(committed) or depth > self.max_depth or ranks[node] >= self.max_rank:
                continue
            self.trials[depth - 1, ranks[node]] += 1
            if tokens[node] == committed[depth - 1]:
                self.hits[depth - 1, ranks[node]] += 1
                on_path.add(node)

    def node_values(self, draft: DraftTree) -> list[float]:
        """Each node's estimated chance of lying on the accepted path: the product of ``acc`` along its path (root 1);
        nodes past the table get 0."""
        acc = self.accuracy()
        ranks = sibling_ranks(draft)
        values = [1.0] * len(draft)
        for node in range(1, len(draft)):
            parent = draft.parents[node]
            depth = int(draft.depths[node])
            inside = depth <= self.max_depth and ranks[node] < self.max_rank
            values[node] = values[parent] * acc[depth - 1][ranks[node]] if inside else 0.0
        return values

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"hits": self.hits.clone(), "trials": self.trials.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        hits, trials = state["hits"].to(torch.float64), state["trials"].to(torch.float64)
        d, r = min(hits.shape[0], self.max_depth), min(hits.shape[1], self.max_rank)
        self.hits[:d, :r], self.trials[:d, :r] = hits[:d, :r], trials[:d, :r]
