"""Hybrid trees: the candidates of several drafters merged into one trie and verified in ONE target forward.

Prompt lookup is strong on copies of the context, Token Recycling on short common continuations, Medusa heads or a
draft model on the model's own hidden state; their candidates overlap only in part. Each decoding step:

1. **Propose.** Every part drafts its own tree for the rows (its own default tree), with fixed candidates (top-k,
   never sampled: the merged tree is verified with point-mass proposals, which keeps sampling exact whatever the
   candidates are).
2. **Score.** Each node of a part's tree gets an estimated chance of lying on the accepted path: the product, along
   its path, of that part's measured acceptance at each (depth, sibling rank) (`OnlineAccuracy`, updated online
   from what the engine accepted, starting from a per-part prior).
3. **Merge.** The parts' trees become one trie below the common root (a path proposed by several parts appears
   once); a merged node's score is the largest of its sources' scores. Scores never grow along a path, so the best
   nodes always include their ancestors.
4. **Keep the best under the cost budget.** Nodes are taken best first; the number kept, N, maximizes expected tau
   per step cost, ``(1 + sum of kept scores) / (c(N + 1) + drafting)``, on the target's cost curve (the parts'
   drafting costs when they state them), within the call's node and depth budget.
5. **Learn.** After verification every part sees the verified (merged) tree and what was accepted, exactly as when
   it drafts alone (`advance_batch`), and the hybrid updates each part's acceptance table from the part's own tree.
"""

from __future__ import annotations

import weakref

import torch

from ..engine.protocol import TreeDrafter
from ..engine.rows import TargetRows
from ..engine.trees import DraftingOptions, DraftTree, TreeSpec, budget_tree
from .cost_aware import target_cost_curve
from .online_accuracy import OnlineAccuracy

__all__ = ["HybridDrafter", "merge_drafts", "budget_tree", "best_nodes"]

#: acceptance prior per sibling rank for a part with no history (the same at every depth)
PART_PRIOR = [0.4, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02] + [0.01] * 56


def merge_drafts(
    drafts: list[DraftTree], values: list[list[float]]
) -> tuple[list[int], list[int], list[float], list[int]]:
    """Merge trees with the same root into one trie.

    Returns ``(tokens, parents, scores, depths)`` in insertion order (root first, parents before children); a node
    reached by several trees keeps the largest of their ``values``.
    """
    tokens, parents, scores, depths = [int(drafts[0].tokens[0])], [-1], [1.0], [0]
    index: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for draft, vals in zip(drafts, values):
        ids = draft.tokens.tolist()
        merged = [0] * len(ids)
        for node in range(1, len(ids)):
            parent = merged[draft.parents[node]]
            key = (parent, ids[node])
            if key not in index:
                index[key] = len(tokens)
                tokens.append(ids[node])
                parents.append(parent)
                scores.append(vals[node])
                depths.append(depths[parent] + 1)
            else:
                scores[index[key]] = max(scores[index[key]], vals[node])
            merged[node] = index[key]
    return tokens, parents, scores, depths


def best_nodes(scores: list[float], depths: list[int], num_nodes: int, max_depth: int, step_cost) -> list[int]:
    """The kept nodes (ascending ids, root included): best scores first, as many as maximize tau per step cost."""
    order = sorted(
        (i for i in range(1, len(scores)) if depths[i] <= max_depth and scores[i] > 0),
        key=lambda i: (-scores[i], depths[i], i),
    )[:num_nodes]
    best_n, best_ratio, tau = 0, 1.0 / step_cost(1), 1.0
    for n, node in enumerate(order, start=1):
        tau += scores[node]
        ratio = tau / step_cost(n + 1)
        if ratio > best_ratio * (1 + 1e-12):
            best_n, best_ratio = n, ratio
    return sorted([0] + order[:best_n])


class HybridDrafter(TreeDrafter):
    """One tree from several drafters (see the module docstring)::

        hybrid = hfs.HybridDrafter([hfs.PromptLookupDrafter(), hfs.TokenRecyclingDrafter(), medusa_heads])
        out = model.generate(input_ids, assistant_model=hybrid, max_new_tokens=128)

    Args:
        parts: drafters: `TreeDrafter` objects, drafter models (Medusa heads, EAGLE, ...) or small causal LMs, as
            ``assistant_model`` takes them. Parts keep their state across calls (Token Recycling's matrix).
        max_nodes: node budget of the merged tree (a call's ``speculative_tree`` gives its own: its node count and depth).
        max_depth: depth budget.
        cost_curve: the target's cost curve ``c(n)``; None: the cached one, else the documented default
            (`cost_aware.target_cost_curve`).
    """

    def __init__(self, parts: list, max_nodes: int = 48, max_depth: int = 10, cost_curve=None):
        if not parts:
            raise ValueError("HybridDrafter needs at least one drafter")
        if max_nodes < 1 or max_depth < 1:
            raise ValueError("max_nodes and max_depth must be >= 1")
        self.parts = list(parts)
        self.max_nodes, self.tree_depth = int(max_nodes), int(max_depth)
        self.default_tree = budget_tree(self.max_nodes, self.tree_depth)
        self.cost_curve = cost_curve
        self.drafters: list[TreeDrafter] = []
        self.accuracy = [OnlineAccuracy(self.tree_depth, 8, PART_PRIOR) for _ in self.parts]
        #: the target the parts were last made drafters for (a weak reference) and those drafters
        self._resolved: tuple[weakref.ref, list[TreeDrafter]] | None = None
        self._part_trees: list[TreeSpec | None] = []  # each part's own tree of the call (set by begin_batch)
        self._own: dict[int, list[DraftTree]] = {}  # row -> each part's own draft of this step

    # ------------------------------------------------------------------ set-up
    def attach_target(self, target) -> None:
        from ..engine.resolve import resolve_drafter

        if self._resolved is None or self._resolved[0]() is not target:  # a model part makes its drafter once
            self._resolved = (weakref.ref(target), [resolve_drafter(target, part) for part in self.parts])
        self.drafters = self._resolved[1]
        for drafter in self.drafters:
            drafter.attach_target(target)
        self._curve = target_cost_curve(target, self.cost_curve)
        declared = [drafter.capabilities for drafter in self.drafters]
        self.needs_target_hidden_states = any(c.needs_target_hidden_states for c in declared)
        self.verified_top_k = max(c.verified_top_k for c in declared)
        vocab = {c.vocab_size for c in declared} - {None}
        self.vocab_size = vocab.pop() if len(vocab) == 1 else None

    def _part_trees_for(self, batch_size: int) -> list[TreeSpec | None]:
        """Each part's own tree: its candidates when it offers more than pays for itself alone (Token Recycling,
        `TreeDrafter.candidate_tree`; the hybrid prices the merged tree), else its default tree for the batch."""
        trees = []
        for drafter in self.drafters:
            candidates = drafter.candidate_tree(self.max_nodes)
            trees.append(candidates if candidates is not None else drafter.tree_for_batch(batch_size))
        return trees

    def draft_modules(self) -> tuple:
        return tuple(m for drafter in self.drafters for m in drafter.draft_modules())

    def _drafting_cost(self) -> float:
        """The parts' drafting cost per step in plain steps (`TreeDrafter.draft_cost`: a number or one per depth)."""
        total = 0.0
        if not hasattr(self._curve, "projection_cost"):  # a plain c(n) callable, no CostCurve: no drafting costs
            return total
        for drafter, tree in zip(self.drafters, self._part_trees):
            if tree is None:
                continue
            cost = drafter.draft_cost(self._curve)
            if isinstance(cost, (int, float)):
                total += float(cost)
            elif len(cost):
                total += float(cost[min(tree.depth, len(cost)) - 1])
        return total

    # ------------------------------------------------------------------ the drafter protocol
    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        if not self.drafters:
            raise RuntimeError("HybridDrafter was not attached to a target (the engine calls attach_target)")
        self._own = {}
        batch = len(prompts)
        self._part_trees = self._part_trees_for(batch)
        for drafter in self.drafters:
            drafter.begin_batch(prompts, target_outputs)
        drafting, curve = self._drafting_cost(), self._curve
        self._step_cost = lambda n: (curve(batch * n) / curve(batch) if batch > 1 else curve(n)) + drafting

    @torch.no_grad()
    def propose_batch(self, sequences, rows, tree: TreeSpec, options: DraftingOptions) -> list[DraftTree]:
        fixed = DraftingOptions(False, options.temperature, options.generator)  # candidates, never samples (step 1)
        per_part = [
            d.propose_batch(sequences, rows, t if t is not None else tree, fixed)
            for d, t in zip(self.drafters, self._part_trees)
        ]
        drafts = []
        for j, (seq, r) in enumerate(zip(sequences, rows)):
            own = [part[j] for part in per_part]
            self._own[r] = own
            values = [acc.node_values(d) for acc, d in zip(self.accuracy, own)]
            tokens, parents, scores, depths = merge_drafts(own, values)
            keep = best_nodes(scores, depths, tree.num_nodes, tree.depth, self._step_cost)
            new_id = {old: new for new, old in enumerate(keep)}
            drafts.append(
                DraftTree(
                    tokens=torch.tensor([tokens[i] for i in keep], dtype=torch.long, device=seq.device),
                    parents=tuple([-1] + [new_id[parents[i]] for i in keep[1:]]),
                )
            )
        return drafts

    def advance_batch(self, sequences, rows, drafts, results, target_outputs: TargetRows) -> None:
        for r, result in zip(rows, results):
            for acc, own in zip(self.accuracy, self._own.get(r, ())):
                acc.observe_tree(own, result.tokens)
        for drafter in self.drafters:
            drafter.advance_batch(sequences, rows, drafts, results, target_outputs)

    def end_batch(self) -> None:
        for drafter in self.drafters:
            drafter.end_batch()
        self._own = {}
