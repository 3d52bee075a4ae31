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

__all__ = ["OnlineAccuracy", "ScoreCalibration", "sibling_ranks", "tried_nodes"]


def tried_nodes(draft: DraftTree, committed: list[int]):
    """``(node, depth, hit)`` for every node of ``draft`` whose parent was on the committed path and whose depth does
    not pass the ``committed`` tokens (accepted drafts then the bonus token): the nodes a step tells something about."""
    tokens = draft.tokens.tolist()
    depth_of = [0] * len(draft)
    on_path = {0}  # nodes whose path equals the committed prefix of their depth
    for node in range(1, len(draft)):
        parent = draft.parents[node]
        depth_of[node] = depth = depth_of[parent] + 1
        if parent not in on_path or depth > len(committed):
            continue
        hit = tokens[node] == committed[depth - 1]
        if hit:
            on_path.add(node)
        yield node, depth, hit


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
        ranks = sibling_ranks(draft)
        for node, depth, hit in tried_nodes(draft, committed):
            if depth <= self.max_depth and ranks[node] < self.max_rank:
                self.trials[depth - 1, ranks[node]] += 1
                self.hits[depth - 1, ranks[node]] += hit

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


class ScoreCalibration:
    """How often a drafter's nodes are right, by the confidence the drafter gave them (`DraftTree.scores`).

    A node's own confidence is its score over its parent's: the drafter's conditional chance that the token follows
    its parent (SuffixDecoding's share of the continuations seen, EAGLE's softmax probability). Nodes below a correct
    parent are counted in ``num_bins`` equal bins of that confidence; each bin starts from its own midpoint as a
    prior worth ``prior_weight`` observations and moves to the measured rate. ``node_values`` gives each node the
    product of its path's calibrated rates: a drafter that claims 1.0 on every copy it finds (SuffixDecoding after a
    single occurrence) gets the rate such copies are actually accepted at.

    Args:
        num_bins: confidence bins over [0, 1].
        prior_weight: how many observations each bin's prior is worth.
    """

    def __init__(self, num_bins: int = 10, prior_weight: float = 8.0):
        if num_bins < 1:
            raise ValueError("num_bins must be >= 1")
        self.num_bins = int(num_bins)
        self.prior_weight = float(prior_weight)
        self.prior = (torch.arange(self.num_bins, dtype=torch.float64) + 0.5) / self.num_bins
        self.hits = torch.zeros(self.num_bins, dtype=torch.float64)
        self.trials = torch.zeros(self.num_bins, dtype=torch.float64)

    def rates(self) -> list[float]:
        """Per bin: (hits + prior x weight) / (trials + weight)."""
        w = self.prior_weight
        return ((self.hits + w * self.prior) / (self.trials + w)).tolist()

    def _bins(self, draft: DraftTree) -> list[int]:
        scores, parents, top = draft.scores, draft.parents, self.num_bins - 1
        bins = [0] * len(draft)
        for node in range(1, len(draft)):
            parent_score = scores[parents[node]]
            own = scores[node] / parent_score if parent_score > 0 else 0.0
            bins[node] = min(max(int(own * self.num_bins), 0), top)
        return bins

    def observe_tree(self, draft: DraftTree, committed: list[int]) -> None:
        """Count the nodes of a scored ``draft`` below the committed path (`tried_nodes`)."""
        bins = self._bins(draft)
        for node, _, hit in tried_nodes(draft, committed):
            self.trials[bins[node]] += 1
            self.hits[bins[node]] += hit

    def node_values(self, draft: DraftTree) -> list[float]:
        """Each node's estimated chance of lying on the accepted path: the product of calibrated rates (root 1)."""
        rates, bins = self.rates(), self._bins(draft)
        values = [1.0] * len(draft)
        for node in range(1, len(draft)):
            values[node] = values[draft.parents[node]] * rates[bins[node]]
        return values
