"""Draft trees: the static shape of a tree (`TreeSpec`) and one decoding step's draft (`DraftTree`).

A tree step verifies ``n = 1 + num_nodes`` tokens in one target forward. Node 0 is the *root*: the last
committed token, which is not in the target's KV cache yet. Every other node is a drafted token whose
parent is an earlier node. Nodes are stored in breadth-first order (parents before children, the
children of a node ordered by their rank), so a node's index is also its offset in the verification
forward and in the KV cache that forward appends.

A static tree is written as Medusa-style *choices* (Cai et al., "Medusa", Sec. 2.1.2 and 2.3.3): each
path is a tuple of top-i indices, ``(0, 1)`` being "the first candidate at depth 1, then the second
candidate after it". A chain of length k is the one-path tree ``cartesian([1] * k)``.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Sequence

import torch

__all__ = [
    "TreeSpec",
    "budget_tree",
    "DynamicTree",
    "DraftTree",
    "DraftingOptions",
    "fill_children",
    "additive_mask",
    "tree_attention_mask",
    "BatchTreeMaskBuffer",
    "batch_tree_block",
    "expected_acceptance_length",
]


def _ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """``A[i, j]`` is True when node j is node i itself or one of its ancestors (parents precede children)."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            if p >= i:
                raise ValueError(f"node {i} has parent {p}: parents must come before their children")
            anc[i] = anc[p]
        anc[i, i] = True
    return anc


def _children_lists(parents: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    children: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            children[p].append(i)
    return tuple(tuple(c) for c in children)


def _greedy_nodes(acc: list[list[float]], num_nodes: int) -> list[tuple[tuple[int, ...], float]]:
    """Medusa 2.3.3's greedy order: up to ``num_nodes`` (path, value) pairs, each the most valuable node whose
    parent and lower-ranked sibling came before; value = product of accuracies along the path. The first N
    form the best tree of N nodes."""
    chosen: list[tuple[tuple[int, ...], float]] = []
    # max-heap of (-value, path, value of the parent)
    heap = [(-acc[0][0], (0,), 1.0)]
    while heap and len(chosen) < num_nodes:
        neg_value, path, parent_value = heapq.heappop(heap)
        chosen.append((path, -neg_value))
        depth, rank = len(path) - 1, path[-1]
        if rank + 1 < len(acc[depth]):  # next-ranked sibling
            heapq.heappush(heap, (-parent_value * acc[depth][rank + 1], path[:-1] + (rank + 1,), parent_value))
        if depth + 1 < len(acc) and acc[depth + 1]:  # first child
            heapq.heappush(heap, (neg_value * acc[depth + 1][0], path + (0,), -neg_value))
    return chosen


def _step_cost(cost: Callable[[float], float], batch_size: int) -> Callable[[int], float]:
    """Tokens in the forward -> its cost in plain (batched) steps."""
    if batch_size == 1:
        return lambda n: float(cost(n))
    base = float(cost(batch_size))
    return lambda n: float(cost(batch_size * n)) / base


def _draft_cost_fn(draft_cost) -> Callable[[int, int], float]:
    """A drafter's cost as ``f(num_nodes, depth)``, from a number, a per-depth sequence or a callable."""
    if callable(draft_cost):
        return lambda n, d: float(draft_cost(n, d))
    if isinstance(draft_cost, (int, float)):
        return lambda n, d: float(draft_cost)
    per_depth = [float(c) for c in draft_cost]
    if not per_depth:
        raise ValueError("draft_cost as a sequence needs one cost per tree depth")
    return lambda n, d: per_depth[min(d, len(per_depth)) - 1]


@dataclass
class DraftingOptions:
    """How this call wants candidates drawn (taken from the generation config)."""

    do_sample: bool = False
    temperature: float = 1.0
    generator: torch.Generator | None = None

    def scheme(self, draft_sampling: str) -> str:
        """The `DraftTree.sampling` scheme: a drafter's own choice when sampling, top-k when greedy."""
        return draft_sampling if self.do_sample else "deterministic"


def fill_children(
    logits: torch.Tensor, num_children: int, scheme: str, options: DraftingOptions, probs: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ranked candidates for one parent from the drafter's logits ``(vocab,)``.

    ``scheme`` is a `DraftTree.sampling` value. ``"deterministic"``: the top-k tokens. Sampling: ``q = softmax(logits / T)`` and k draws,
    without replacement by the Gumbel-top-k trick (the i-th is a draw from q without the first i-1) or
    with replacement. ``probs``: q when the caller already has it (several parents drawing from one row).
    Returns the tokens and q (None when deterministic).
    """
    k = min(num_children, logits.shape[-1])
    if scheme == "deterministic":
        return torch.topk(logits, k).indices, None
    q = probs if probs is not None else torch.softmax(logits.float() / max(options.temperature, 1e-5), dim=-1)
    if scheme == "with_replacement":
        return torch.multinomial(q, num_children, replacement=True, generator=options.generator), q
    u = torch.rand(q.shape, generator=options.generator, device=q.device).clamp_(1e-20, 1.0)
    gumbel = torch.log(q) - torch.log(-torch.log(u))
    return torch.topk(gumbel, k).indices, q


@dataclass(frozen=True)
class TreeSpec:
    """A static draft tree, as sorted Medusa-style paths of top-i indices (the root is implicit).

    Derived structure (parents, depths, ranks, ancestor matrix, children) is computed once per shape and
    cached on the instance, so a decoding loop that reuses one spec builds its masks once.
    """

    paths: tuple[tuple[int, ...], ...]

    def __post_init__(self):
        paths = tuple(sorted({tuple(int(i) for i in p) for p in self.paths}, key=lambda p: (len(p), p)))
        known = set(paths)
        for p in paths:
            if len(p) == 0:
                raise ValueError("a tree path cannot be empty (the root is implicit)")
            if min(p) < 0:
                raise ValueError(f"tree path {list(p)} has a negative top-i index")
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(
                    f"tree path {list(p)} has no parent path {list(p[:-1])}: every prefix of a path must be in the tree"
                )
            if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in known:
                raise ValueError(
                    f"tree path {list(p)} skips its lower-ranked sibling {list(p[:-1] + (p[-1] - 1,))}: "
                    "the i-th candidate needs candidates 0..i-1"
                )
        object.__setattr__(self, "paths", paths)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_choices(cls, choices: Iterable[Sequence[int]]) -> "TreeSpec":
        """Build from Medusa-style choices, e.g. ``[[0], [1], [0, 0], [0, 1], [1, 0]]``."""
        return cls(tuple(tuple(c) for c in choices))

    @classmethod
    def cartesian(cls, branching: Sequence[int]) -> "TreeSpec":
        """Every combination of the top-``branching[d]`` candidates at depth d (``[3, 2, 2]``: 3 + 6 + 12 nodes)."""
        if not branching or any(int(b) < 1 for b in branching):
            raise ValueError(f"cartesian branching must be a non-empty list of positive ints, got {list(branching)}")
        paths = []
        for depth in range(1, len(branching) + 1):
            paths.extend(itertools.product(*[range(int(b)) for b in branching[:depth]]))
        return cls(tuple(paths))

    @classmethod
    def chain(cls, length: int) -> "TreeSpec":
        """A single path of ``length`` drafted tokens (what transformers' assisted decoding verifies)."""
        return cls.cartesian([1] * int(length))

    @classmethod
    def optimize(
        cls,
        accuracies,
        num_nodes: int,
        cost: "Callable[[float], float] | None" = None,
        draft_cost: "float | Sequence[float] | Callable[[int, int], float]" = 0.0,
        batch_size: int = 1,
    ) -> "TreeSpec":
        """Medusa Sec. 2.3.3: greedily grow the tree that maximizes the expected acceptance length.

        ``accuracies[d][i]`` is the measured probability that the i-th ranked candidate at depth ``d + 1``
        is the correct token (top-i accuracy of head d). Under the independence assumption of the paper,
        a node's chance of being on the accepted path is the product of the accuracies along its path,
        and the expected acceptance length is the sum of these products over the nodes. Adding nodes one
        at a time in order of that product (only nodes whose parent and lower-ranked sibling are already
        in the tree) gives the tree of ``num_nodes`` nodes with the largest expected length.

        With ``cost`` (a `hf_speculative.perf_model.CostCurve` or any ``c(n)``: the cost of a target forward
        over n tokens in one-token steps), ``num_nodes`` is an upper bound and the tree maximizes the
        expected *speed* instead (Sequoia's hardware-aware size, SPIRe's Delta t):

            tau(T) / (c(N + 1) + draft_cost(N, depth))

        with tau(T) = 1 + the sum of the node values (`expected_acceptance_length`) and N the tree's nodes
        (the forward also carries the root).
        For every depth limit D (first D rows of the table) and every size N the greedy tree is scored; the
        best ratio wins (ties: the smaller, shallower tree). ``draft_cost`` is the drafter's cost per step in
        plain steps: a number, a sequence indexed by the tree's depth - 1, or ``f(num_nodes, depth)``.
        ``batch_size`` B scores a forward over B rows of N + 1 tokens against a plain batched step,
        ``c(B (N + 1)) / c(B)``.
        """
        acc = [[float(a) for a in row] for row in accuracies]
        if num_nodes < 1 or not acc or not acc[0]:
            raise ValueError("optimize needs num_nodes >= 1 and a non-empty accuracy table")
        if cost is None:
            return cls(tuple(path for path, _ in _greedy_nodes(acc, num_nodes)))
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        step = _step_cost(cost, batch_size)
        drafting = _draft_cost_fn(draft_cost)
        best, best_ratio = None, float("-inf")
        for max_depth in range(1, len(acc) + 1):
            if not acc[max_depth - 1]:
                break
            tau, depth, paths = 1.0, 0, []
            for path, value in _greedy_nodes(acc[:max_depth], num_nodes):
                paths.append(path)
                tau += value
                depth = max(depth, len(path))
                ratio = tau / (step(len(paths) + 1) + drafting(len(paths), depth))
                if ratio > best_ratio * (1 + 1e-12):
                    best, best_ratio = tuple(paths), ratio
        return cls(best)

    def expected_speedup(
        self,
        accuracies,
        cost: Callable[[float], float],
        draft_cost: "float | Sequence[float] | Callable[[int, int], float]" = 0.0,
        batch_size: int = 1,
    ) -> float:
        """The quantity `optimize` maximizes with a ``cost``: expected tau over the step's cost in plain steps,
        ``tau / (c(N + 1) + draft_cost)`` (below 1: the tree does not pay for itself on that cost curve)."""
        step = _step_cost(cost, batch_size)(self.num_nodes + 1)
        return self.expected_acceptance_length(accuracies) / (
            step + _draft_cost_fn(draft_cost)(self.num_nodes, self.depth)
        )

    def expected_acceptance_length(self, accuracies) -> float:
        """1 (the bonus token) + the sum over nodes of the product of ``accuracies`` along the node's path
        (Medusa Sec. 2.3.3's estimate of tau; ranks beyond a row count as 0)."""
        total = 1.0
        for path in self.paths:
            p = 1.0
            for depth, rank in enumerate(path):
                row = accuracies[depth] if depth < len(accuracies) else ()
                p *= row[rank] if rank < len(row) else 0.0
            total += p
        return total

    # ------------------------------------------------------------------ derived structure (cached)
    @property
    def num_nodes(self) -> int:
        """Drafted nodes, the root excluded."""
        return len(self.paths)

    @cached_property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @cached_property
    def parents(self) -> tuple[int, ...]:
        """Parent index per node, root included (``parents[0] == -1``)."""
        index = {(): 0}
        for i, p in enumerate(self.paths, start=1):
            index[p] = i
        return (-1,) + tuple(index[p[:-1]] for p in self.paths)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """Which ranked candidate of its parent each node is (root: 0)."""
        return (0,) + tuple(p[-1] for p in self.paths)

    @cached_property
    def depths(self) -> torch.Tensor:
        return torch.tensor([0] + [len(p) for p in self.paths], dtype=torch.long)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        return _children_lists(self.parents)

    @cached_property
    def ancestors(self) -> torch.Tensor:
        return _ancestor_matrix(self.parents)

    def to_list(self) -> list[list[int]]:
        """JSON-friendly form for configs (inverse of `from_choices`)."""
        return [list(p) for p in self.paths]

    def fill(
        self, logits: torch.Tensor, root_token: torch.Tensor, scheme: str, options: DraftingOptions
    ) -> "DraftTree":
        """This step's draft from one distribution per depth (row d drafts depth d + 1), whatever the parent: the
        drafting rule of Medusa heads, ParallelSpec's mask positions and Speculative Streaming's streams.

        ``"deterministic"``: the node of depth d and rank i gets row d - 1's i-th most likely token (Medusa's
        Cartesian / sparse trees). Sampling: every inner node's children are drawn from its depth's q by
        `fill_children`, and q is kept per node for exact tree rejection sampling.
        """
        device = root_token.device
        root = root_token.reshape(1)
        depths = self.depths.tolist()
        if scheme == "deterministic":
            width = max(self.ranks[1:]) + 1
            top = torch.topk(logits[: self.depth], min(width, logits.shape[-1]), dim=-1).indices  # (depth, width)
            idx = torch.tensor(depths[1:], device=top.device) - 1
            rank = torch.tensor(self.ranks[1:], device=top.device)
            tokens = torch.cat([root.to(top.device), top[idx, rank]]).to(device)
            return DraftTree.from_spec(self, tokens, sampling=scheme)
        n = self.num_nodes + 1
        tokens = torch.empty(n, dtype=torch.long, device=device)
        tokens[0] = root[0]
        probs = torch.zeros(n, logits.shape[-1], device=device)
        per_depth = torch.softmax(
            logits[: self.depth].float() / max(options.temperature, 1e-5), dim=-1
        )  # q once per depth
        for node, kids in enumerate(self.children):
            if kids:
                chosen, q = fill_children(
                    logits[depths[node]], len(kids), scheme, options, probs=per_depth[depths[node]]
                )
                tokens[list(kids)] = chosen.to(device)
                probs[node] = q.to(device)
        return DraftTree.from_spec(self, tokens, draft_probs=probs, sampling=scheme)

    def __repr__(self) -> str:
        return f"TreeSpec(num_nodes={self.num_nodes}, depth={self.depth})"


def expected_acceptance_length(tree: TreeSpec, accuracies) -> float:
    """Expected tokens per step of ``tree`` when depth d's i-th ranked draft is right with probability
    ``accuracies[d][i]``, independently (Medusa Sec. 2.3.3): 1 (the bonus token) + sum over nodes of the product
    of the accuracies along the node's path. Every drafter's tree calibration uses it."""
    return tree.expected_acceptance_length(accuracies)


class DynamicTree:
    """A per-step tree built from the drafter's own confidence: EAGLE-2 (Li et al. 2024, Sec. 4).

    Pass it as ``speculative_tree=DynamicTree(total_tokens=16, depth=4, top_k=4)`` to a drafter that drafts
    from one distribution per depth (Medusa heads, ParallelDrafter, Speculative Streaming: `build`) or one
    distribution per parent (EAGLE, autoregressive: `grow`). Each step:

    * *expand* (Sec. 4.2): the root's ``top_k`` most likely tokens form depth 1; at every further depth the
      ``top_k`` nodes of the previous depth with the highest *path confidence* (the product of draft
      probabilities along the path) each get their ``top_k`` most likely children, down to ``depth``;
    * *rerank* (Sec. 4.3): of all expanded candidates the ``total_tokens`` with the highest path confidence
      form the draft. A child's confidence never exceeds its parent's (ties keep the earlier, shallower
      node), so the kept set contains every kept node's parent.

    The candidates are fixed choices (``DraftTree.sampling == "deterministic"``), so greedy decoding stays
    exact and sampling stays lossless: tree rejection sampling with a one-hot proposal per child.

    The tree's shape changes every step: only ``depth`` (the drafter's depth check) and ``num_nodes``
    (the budget) are known in advance; the per-node structure lives in each step's `DraftTree`. It is not a
    `TreeSpec` (no parents, ranks or masks of its own); both fill a step's draft from per-depth logits (`fill`).
    """

    def __init__(self, total_tokens: int = 16, depth: int = 4, top_k: int = 4):
        if total_tokens < 1 or depth < 1 or top_k < 1:
            raise ValueError(
                f"DynamicTree needs total_tokens, depth and top_k >= 1, got {total_tokens}, {depth}, {top_k}"
            )
        self.total_tokens, self.depth, self.top_k = int(total_tokens), int(depth), int(top_k)

    @property
    def num_nodes(self) -> int:
        """The node budget (drafted nodes, the root excluded)."""
        return self.total_tokens

    def fill(
        self, logits: torch.Tensor, root_token: torch.Tensor, scheme: str, options: DraftingOptions
    ) -> "DraftTree":
        """This step's draft from one distribution per depth (`build`): top-k candidates in every mode."""
        return self.build(torch.log_softmax(logits[: self.depth].float(), dim=-1), root_token)

    def __eq__(self, other) -> bool:
        return isinstance(other, DynamicTree) and (self.total_tokens, self.depth, self.top_k) == (
            other.total_tokens,
            other.depth,
            other.top_k,
        )

    def __hash__(self) -> int:
        return hash(("DynamicTree", self.total_tokens, self.depth, self.top_k))

    def __repr__(self) -> str:
        return f"DynamicTree(total_tokens={self.total_tokens}, depth={self.depth}, top_k={self.top_k})"

    def build(self, depth_log_probs: torch.Tensor, root_token: torch.Tensor | int) -> "DraftTree":
        """This step's draft from one log-distribution per depth (``depth_log_probs[d]`` drafts depth d + 1,
        whatever the parent, as Medusa heads do). Nodes come out depth by depth, parents first."""
        num_depths = min(self.depth, depth_log_probs.shape[0])

        def same_row_for_every_parent(depth, frontier, tokens, parents):
            return depth_log_probs[depth][None].expand(len(frontier), -1)

        return self.grow(depth_log_probs[0], same_row_for_every_parent, root_token, num_depths)

    def grow(
        self,
        root_log_probs: torch.Tensor,
        expand: Callable[[int, list[int], torch.Tensor, torch.Tensor], torch.Tensor],
        root_token: torch.Tensor | int,
        num_depths: int | None = None,
        vocab_ids: torch.Tensor | None = None,
    ) -> "DraftTree":
        """EAGLE-2's tree (Sec. 4.2-4.3) from a drafter with one distribution per *parent* (EAGLE drafts
        autoregressively: a node's children come from the drafter run on that node).

        ``root_log_probs (V,)``: the log-distribution of depth 1. ``expand(depth, frontier, tokens, parents)`` is
        called once per further depth with ``frontier``, the candidates to expand (indices into the candidates
        so far, the ``top_k`` of the last depth by path confidence), ``tokens`` and ``parents`` of all candidates
        so far (a parent is a candidate index, -1 for the root); it returns ``(len(frontier), V)``
        log-probabilities of each frontier candidate's children. Candidates with zero probability (``-inf``,
        e.g. outside a draft vocabulary) are never kept. ``vocab_ids``: the token id of each column of the rows
        (a drafter over a truncated draft vocabulary, EAGLE-3's ``d2t``); default the column index.
        """
        to_ids = (lambda ids: ids) if vocab_ids is None else (lambda ids: vocab_ids.to(ids.device)[ids])
        num_depths = self.depth if num_depths is None else min(self.depth, num_depths)
        k = min(self.top_k, root_log_probs.shape[-1])
        top_lp, top_ids = torch.topk(root_log_probs.float(), k, dim=-1)
        top_ids = to_ids(top_ids)
        device = top_ids.device
        # candidate c is tree node c + 1 (node 0 is the root); candidates are stored depth by depth
        scores, parents, tokens = [top_lp.cpu()], [torch.full((k,), -1, dtype=torch.long)], [top_ids.cpu()]
        offset, frontier = 0, torch.arange(k)  # first candidate of the last depth; the candidates to expand
        for d in range(1, num_depths):
            rows = expand(d, frontier.tolist(), torch.cat(tokens), torch.cat(parents))
            lp, ids = torch.topk(rows.float(), k, dim=-1)  # (frontier, k), best first
            children = (scores[-1][frontier - offset][:, None] + lp.cpu()).reshape(-1)
            parents.append(frontier.repeat_interleave(k))
            tokens.append(to_ids(ids).cpu().reshape(-1))
            offset += scores[-1].shape[0]
            scores.append(children)
            frontier = offset + torch.sort(children, descending=True, stable=True).indices[:k]
        all_scores, all_parents, all_tokens = torch.cat(scores), torch.cat(parents), torch.cat(tokens)
        kept = torch.sort(all_scores, descending=True, stable=True).indices[: self.total_tokens]
        kept = kept[torch.isfinite(all_scores[kept])].sort().values
        new_index = torch.zeros(all_scores.shape[0] + 1, dtype=torch.long)
        new_index[kept + 1] = torch.arange(1, kept.shape[0] + 1)
        node_parents = new_index[all_parents[kept] + 1].tolist()
        root = torch.as_tensor(root_token).reshape(1).cpu()
        tokens = torch.cat([root, all_tokens[kept]]).to(device)
        scores = tuple([1.0] + all_scores[kept].exp().tolist())  # path confidence, EAGLE-2's ranking
        return DraftTree(tokens=tokens, parents=tuple([-1] + node_parents), scores=scores)


@dataclass
class DraftTree:
    """One step's draft: a token per node (node 0 is the root, the last committed token).

    ``draft_probs[i]`` is the drafter's distribution q over the children of node i, needed for lossless
    sampling; ``sampling`` states how the children were drawn from it, which decides the residual update
    used by rejection sampling (see `hf_speculative.engine.acceptance`):

    * ``"deterministic"``: children are fixed choices (e.g. top-k); no ``draft_probs`` needed.
    * ``"without_replacement"``: the i-th child was drawn from q with the earlier siblings removed
      (Gumbel-top-k sampling).
    * ``"with_replacement"``: every child is an independent draw from q (SpecInfer).

    ``scores[i]``, when the drafter gives them, is its own estimate of the chance that node i lies on the accepted
    path (the root's 1.0; a child's never above its parent's): SuffixDecoding's empirical path probability, EAGLE's
    path confidence. Verification never reads them; `HybridDrafter` calibrates them to rank nodes across drafters.
    """

    tokens: torch.Tensor  # (n,) long
    parents: tuple[int, ...]
    draft_probs: torch.Tensor | None = None  # (n, vocab) float, rows of leaves unused
    sampling: str = "deterministic"
    scores: tuple[float, ...] | None = None
    _spec: TreeSpec | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.sampling not in ("deterministic", "without_replacement", "with_replacement"):
            raise ValueError(f"unknown draft sampling scheme {self.sampling!r}")
        if self.tokens.dim() != 1 or self.tokens.numel() != len(self.parents):
            raise ValueError("DraftTree.tokens must be 1-D with one token per node")
        if self.scores is not None and len(self.scores) != len(self.parents):
            raise ValueError("DraftTree.scores must hold one score per node")

    @classmethod
    def from_spec(cls, spec: TreeSpec, tokens: torch.Tensor, **kwargs) -> "DraftTree":
        """A draft filling a static tree; reuses the spec's cached ancestor matrix."""
        return cls(tokens=tokens, parents=spec.parents, _spec=spec, **kwargs)

    def __len__(self) -> int:
        return len(self.parents)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        return self._spec.children if self._spec is not None else _children_lists(self.parents)

    @cached_property
    def ancestors(self) -> torch.Tensor:
        return self._spec.ancestors if self._spec is not None else _ancestor_matrix(self.parents)

    @cached_property
    def depths(self) -> torch.Tensor:
        if self._spec is not None:
            return self._spec.depths
        return self.ancestors.sum(-1) - 1

    def select(self, keep: Sequence[int]) -> "DraftTree":
        """The draft restricted to nodes ``keep`` (ascending, closed under ancestors: node 0 and every kept
        node's parent included), renumbered in that order."""
        keep = list(keep)
        new_index = {old: new for new, old in enumerate(keep)}
        if not keep or keep[0] != 0 or any(self.parents[k] not in new_index for k in keep[1:]):
            raise ValueError("select() needs ascending node indices that include the root and every kept node's parent")
        index = torch.tensor(keep, dtype=torch.long, device=self.tokens.device)
        probs = None if self.draft_probs is None else self.draft_probs[index.to(self.draft_probs.device)]
        parents = tuple([-1] + [new_index[self.parents[k]] for k in keep[1:]])
        scores = None if self.scores is None else tuple(self.scores[k] for k in keep)
        return DraftTree(
            tokens=self.tokens[index], parents=parents, draft_probs=probs, sampling=self.sampling, scores=scores
        )

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, both included."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(q, k)`` bool visibility -> ``(1, 1, q, k)`` additive float mask (0 visible, dtype min hidden).

    transformers passes custom 4D masks through unchanged; eager attention adds them to the scores and
    sdpa takes a float mask as a bias, so a float mask serves both.
    """
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def tree_attention_mask(
    ancestors: torch.Tensor,
    past_length: int,
    dtype: torch.dtype,
    device: torch.device | str,
    past_visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Additive 4D mask ``(1, 1, n, past_length + n)`` for a tree verification forward.

    The cached prefix is visible to every node (``past_visible`` can hide padding); each node sees its
    ancestors and itself.
    """
    n = ancestors.shape[0]
    visible = torch.ones(n, past_length + n, dtype=torch.bool, device=device)
    if past_visible is not None:
        visible[:, :past_length] = past_visible.to(device=device, dtype=torch.bool)
    visible[:, past_length:] = ancestors.to(device)
    return additive_mask(visible, dtype)


#: cached tree blocks of `batch_tree_block`: static trees need one; a dynamic tree's every step has its own shape
MAX_BLOCKS = 8


class BatchTreeMaskBuffer:
    """The additive tree masks ``(A, 1, n, C + n)`` of one decoding call, written into one buffer instead of rebuilt
    per step (equal to `tree_attention_mask` per row at every step).

    ``visible`` ``(A, C)`` says which cached columns hold each row's real tokens (False: left padding, or a
    hole left where a row accepted a shorter path than the batch's longest). Columns of the prefix are
    written once from ``visible`` as they join it; each step writes the tree block ``(A or 1, n, n)`` (0 where
    a node sees an ancestor or itself) after them. The returned mask is a view of the buffer.
    """

    def __init__(self, dtype: torch.dtype, device: torch.device | str):
        self.dtype, self.device = dtype, torch.device(device)
        self.buffer = torch.zeros(0, 1, 0, 0, dtype=dtype, device=self.device)
        self.prefix = 0  # columns [0, prefix) hold the prefix visibility

    def __call__(self, visible: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        rows_a, length = visible.shape
        n = block.shape[-1]
        _, _, rows, capacity = self.buffer.shape
        if self.buffer.shape[0] != rows_a or n > rows or length + n > capacity:
            rows, capacity = max(n, rows), max(length + n, 2 * capacity, 64)
            self.buffer = torch.zeros(rows_a, 1, rows, capacity, dtype=self.dtype, device=self.device)
            self.prefix = 0
        if length > self.prefix:  # columns that joined the prefix since the last step (for every buffer row)
            new = visible[:, self.prefix : length].to(self.device)
            cols = self.buffer[:, 0, :, self.prefix : length]
            cols.zero_()
            if not bool(new.all()):
                cols.masked_fill_(~new[:, None, :], torch.finfo(self.dtype).min)
            self.prefix = length
        self.buffer[:, 0, :n, length : length + n] = block
        return self.buffer[:, :, :n, : length + n]

    def select(self, rows: torch.Tensor) -> None:
        """Keep the buffer rows of the rows still generating. The buffer is sized on the first tree step, so rows that
        leave the batch before it (stopped by the prefill's token) leave nothing here to select: the first step sizes
        the buffer to the rows that remain."""
        if self.buffer.shape[0] == 0:
            return
        self.buffer = self.buffer.index_select(0, rows.to(self.device))


def batch_tree_block(
    drafts: Sequence["DraftTree"], dtype: torch.dtype, device, cache: list | None = None
) -> torch.Tensor:
    """The additive tree block ``(A or 1, n, n)`` of a step's drafts, padded to the widest (a padding node sees
    itself only). Drafts of one static spec share one cached block (``cache``: a list of (spec, block) pairs, found
    by the spec's identity, at most `MAX_BLOCKS` of them)."""
    spec = drafts[0]._spec
    if spec is not None and all(d._spec is spec for d in drafts):
        cached = next((block for known, block in cache or () if known is spec), None)
        if cached is not None:
            return cached
        block = additive_mask(spec.ancestors.to(device), dtype)[0]
        if cache is not None:
            if len(cache) >= MAX_BLOCKS:
                cache.clear()
            cache.append((spec, block))
        return block
    if len(drafts) == 1:
        return additive_mask(drafts[0].ancestors.to(device), dtype)[0]
    n = max(len(d) for d in drafts)
    visible = torch.eye(n, dtype=torch.bool).repeat(len(drafts), 1, 1)
    for a, d in enumerate(drafts):
        visible[a, : len(d), : len(d)] = d.ancestors
    return additive_mask(visible.to(device), dtype)[0, 0]


def budget_tree(num_nodes: int, depth: int) -> TreeSpec:
    """A tree that only carries a budget (``num_nodes`` nodes, ``depth`` levels): a chain plus first-level siblings.
    Drafters that build their own trie (prompt lookup, the hybrid, suffix trees) read only its size and depth."""
    depth = max(1, min(depth, num_nodes))
    return TreeSpec.from_choices(
        [[0] * d for d in range(1, depth + 1)] + [[i] for i in range(1, num_nodes - depth + 1)]
    )
