"""Hybrid trees: the candidates of several drafters merged into one trie and verified in ONE target forward.

Prompt lookup is strong on copies of the context, Token Recycling on short common continuations, Medusa heads or a
draft model on the model's own hidden state; their candidates overlap only in part. Each decoding step:

1. **Propose.** Every part drafts its own tree for the rows (its own default tree), with fixed candidates (top-k,
   never sampled: the merged tree is verified with point-mass proposals, which keeps sampling exact whatever the
   candidates are).
   **Gate.** A part that costs drafting time (a drafter network: EAGLE, Medusa heads, a draft model) and declares
   its proposals optional (`TreeDrafter.proposals_optional`) drafts for a row only when it pays there: the free
   parts draft first, and the costly part runs for the rows where the tokens it has been adding beyond the free
   parts' plan, measured at plans of that quality, are worth its drafting time and the verification of the nodes it
   adds (`DraftGate`). When SuffixDecoding has found a long copy, EAGLE's forwards are not run at all.
2. **Score.** Each node of a part's tree gets an estimated chance of lying on the accepted path: the product, along
   its path, of that part's measured acceptance. A part that scores its own nodes (`DraftTree.scores`:
   SuffixDecoding's empirical probability, EAGLE's confidence) is measured by that confidence
   (`ScoreCalibration`: the measured rate per confidence bin), so a copy seen a hundred times outranks a guess; other
   parts by (depth, sibling rank) (`OnlineAccuracy`). Both are updated online from what the engine accepted,
   starting from a prior.
3. **Merge.** The parts' trees become one trie below the common root (a path proposed by several parts appears
   once); a merged node's score is the largest of its sources' scores. Scores never grow along a path, so the best
   nodes always include their ancestors.
4. **Keep the best under the cost budget.** Nodes are taken best first; the number kept, N, maximizes expected tau
   per step cost, ``(1 + sum of kept scores) / (c(N + 1) + drafting)``, on the target's cost curve (the parts'
   drafting costs when they state them), within the call's node and depth budget. A row only one free part drafted
   for, a part that prices its own draft (SuffixDecoding, on the rows the gate leaves EAGLE out of:
   `TreeDrafter.prices_own_draft`), is verified with that draft as it is: the tree the part verifies alone, so the
   hybrid is never below it there.
5. **Learn.** After verification every part sees the verified (merged) tree and what was accepted, exactly as when
   it drafts alone (`advance_batch`), and the hybrid updates each part's acceptance table from the part's own tree
   (when it drafted one for the row).
"""

from __future__ import annotations

import weakref

import torch

from ..engine.protocol import TreeDrafter
from ..engine.rows import TargetRows
from ..engine.trees import DraftingOptions, DraftTree, TreeSpec, budget_tree
from .cost_aware import target_cost_curve
from .draft_gate import DraftGate, accepted_depth
from .online_accuracy import OnlineAccuracy, ScoreCalibration

__all__ = ["HybridDrafter", "merge_drafts", "budget_tree", "best_nodes", "best_plan", "kept_draft"]

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


def best_plan(
    scores: list[float], depths: list[int], num_nodes: int, max_depth: int, step_cost
) -> tuple[list[int], float]:
    """The kept nodes (ascending ids, root included), best scores first, as many as maximize expected tokens per step
    cost, and that ratio: ``(1 + sum of kept scores) / step_cost(kept + 1)``."""
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
    return sorted([0] + order[:best_n]), best_ratio


def best_nodes(scores: list[float], depths: list[int], num_nodes: int, max_depth: int, step_cost) -> list[int]:
    """The kept nodes of `best_plan`."""
    return best_plan(scores, depths, num_nodes, max_depth, step_cost)[0]


def kept_draft(tokens: list[int], parents: list[int], scores: list[float], keep: list[int], device) -> DraftTree:
    """The draft of the trie nodes ``keep`` (ascending, root first, closed under ancestors), renumbered, with their
    scores."""
    new_id = {old: new for new, old in enumerate(keep)}
    return DraftTree(
        tokens=torch.tensor([tokens[i] for i in keep], dtype=torch.long, device=device),
        parents=tuple([-1] + [new_id[parents[i]] for i in keep[1:]]),
        scores=tuple(scores[i] for i in keep),
    )


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
        gate: let a costly part draft only for the rows where it pays (step 1's gate); False: every part drafts for
            every row on every step.
    """

    def __init__(self, parts: list, max_nodes: int = 48, max_depth: int = 10, cost_curve=None, gate: bool = True):
        if not parts:
            raise ValueError("HybridDrafter needs at least one drafter")
        if max_nodes < 1 or max_depth < 1:
            raise ValueError("max_nodes and max_depth must be >= 1")
        self.parts = list(parts)
        self.max_nodes, self.tree_depth = int(max_nodes), int(max_depth)
        self.default_tree = budget_tree(self.max_nodes, self.tree_depth)
        self.cost_curve = cost_curve
        self.drafters: list[TreeDrafter] = []
        self.gate = bool(gate)
        self.accuracy = [OnlineAccuracy(self.tree_depth, 8, PART_PRIOR) for _ in self.parts]
        self.calibration = [ScoreCalibration() for _ in self.parts]
        #: per part: rows it drafted for and rows the gate left it out of (over this drafter's life)
        self.drafted = [0] * len(self.parts)
        self.skipped = [0] * len(self.parts)
        #: per part: its gate (used when the part costs drafting time and its proposals are optional)
        self.gates = [DraftGate() for _ in self.parts]
        self._free: dict[int, tuple] = {}  # row -> the free parts' plan of this step (when a part was gated)
        self._merged_cost: dict[int, float] = {}  # row -> this step's verification cost (when a gated part drafted)
        #: the target the parts were last made drafters for (a weak reference) and those drafters
        self._resolved: tuple[weakref.ref, list[TreeDrafter]] | None = None
        self._part_trees: list[TreeSpec | None] = []  # each part's own tree of the call (set by begin_batch)
        self._own: dict[int, list[DraftTree]] = {}  # row -> each part's own draft of this step

    @property
    def learns_across_calls(self) -> bool:
        """Whether a part keeps what it saw across calls (`TreeDrafter.learns_across_calls`)."""
        return any(isinstance(part, TreeDrafter) and part.learns_across_calls for part in self.parts)

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

    def _part_costs(self) -> list[float]:
        """Each part's drafting cost per step in plain steps (`TreeDrafter.draft_cost`: a number or one per depth, read
        at the depth of the part's own tree)."""
        costs = [0.0] * len(self.drafters)
        if not hasattr(self._curve, "projection_cost"):  # a plain c(n) callable, no CostCurve: no drafting costs
            return costs
        for i, (drafter, tree) in enumerate(zip(self.drafters, self._part_trees)):
            if tree is None:
                continue
            cost = drafter.draft_cost(self._curve)
            if isinstance(cost, (int, float)):
                costs[i] = float(cost)
            elif len(cost):
                costs[i] = float(cost[min(tree.depth, len(cost)) - 1])
        return costs

    def _drafting_cost(self) -> float:
        """The parts' drafting cost per step in plain steps, all together."""
        return sum(self._part_costs())

    # ------------------------------------------------------------------ the drafter protocol
    def begin_batch(self, prompts: list[torch.LongTensor], target_outputs: TargetRows) -> None:
        if not self.drafters:
            raise RuntimeError("HybridDrafter was not attached to a target (the engine calls attach_target)")
        self._own, self._free, self._merged_cost = {}, {}, {}
        batch = len(prompts)
        self._part_trees = self._part_trees_for(batch)
        for drafter in self.drafters:
            drafter.begin_batch(prompts, target_outputs)
        self._costs, curve = self._part_costs(), self._curve
        self._gated = [
            self.gate and cost > 0 and d.capabilities.proposals_optional for d, cost in zip(self.drafters, self._costs)
        ]
        self._prices_own = [d.capabilities.prices_own_draft for d in self.drafters]
        self._verify_cost = lambda n: curve(batch * n) / curve(batch) if batch > 1 else curve(n)

    def _plan(self, own: list[DraftTree | None], values: list[list[float] | None], tree: TreeSpec, root: int):
        """Merge the drafts a row has (`merge_drafts`) and keep the best nodes under the cost budget, the drafting of
        the parts that drafted included: ``(tokens, parents, scores, kept nodes, expected tokens, verification cost)``
        (tokens, parents and scores over the whole merged trie)."""
        present = [i for i, draft in enumerate(own) if draft is not None]
        if not present:  # every part gated out: a one-token step
            return [root], [-1], [1.0], [0], 1.0, self._verify_cost(1)
        if len(present) == 1 and not self._gated[present[0]] and self._prices_own[present[0]]:
            return self._alone_plan(own[present[0]], values[present[0]], tree)
        drafting = sum(self._costs[i] for i in present)
        tokens, parents, scores, depths = merge_drafts([own[i] for i in present], [values[i] for i in present])
        keep, ratio = best_plan(scores, depths, tree.num_nodes, tree.depth, lambda n: self._verify_cost(n) + drafting)
        tau = 1.0 + sum(scores[i] for i in keep[1:])
        return tokens, parents, scores, keep, tau, tau / ratio - drafting

    def _alone_plan(self, draft: DraftTree, values: list[float], tree: TreeSpec):
        """`_plan` of a row that only a free part pricing its own draft drafted for (`TreeDrafter.prices_own_draft`):
        that draft as it is, the tree the part would verify alone, cut to the call's node and depth budget."""
        parents = list(draft.parents)
        depths = [0] * len(parents)
        for node in range(1, len(parents)):
            depths[node] = depths[parents[node]] + 1
        keep = [node for node in range(len(parents)) if depths[node] <= tree.depth][: tree.num_nodes + 1]
        tau = 1.0 + sum(values[node] for node in keep[1:])
        return draft.tokens.tolist(), parents, list(values), keep, tau, self._verify_cost(len(keep))

    def _values(self, part: int, draft: DraftTree) -> list[float]:
        table = self.calibration[part] if draft.scores is not None else self.accuracy[part]
        return table.node_values(draft)

    @torch.no_grad()
    def propose_batch(self, sequences, rows, tree: TreeSpec, options: DraftingOptions) -> list[DraftTree]:
        fixed = DraftingOptions(False, options.temperature, options.generator)  # candidates, never samples (step 1)
        own = [[None] * len(self.drafters) for _ in rows]
        values = [[None] * len(self.drafters) for _ in rows]

        def draft(i, picked):  # part i's drafts for the rows ``picked`` (indices into rows)
            part_tree = self._part_trees[i] if self._part_trees[i] is not None else tree
            seqs = [sequences[j] for j in picked]
            for j, d in zip(picked, self.drafters[i].propose_batch(seqs, [rows[j] for j in picked], part_tree, fixed)):
                own[j][i], values[j][i] = d, self._values(i, d)
            self.drafted[i] += len(picked)
            self.skipped[i] += len(rows) - len(picked)

        everyone = list(range(len(rows)))
        for i in (i for i, gated in enumerate(self._gated) if not gated):
            draft(i, everyone)
        plans = [None] * len(rows)  # a row's plan, when no gated part drafts for it: the free parts' plan
        self._free, self._merged_cost = {}, {}
        if any(self._gated):
            plans = [self._plan(own[j], values[j], tree, int(sequences[j][0, -1])) for j in everyone]
            self._free = {rows[j]: plan for j, plan in enumerate(plans)}
            for i in (i for i, gated in enumerate(self._gated) if gated):
                draft(i, [j for j in everyone if self.gates[i].wants(plans[j][4], plans[j][5], self._costs[i])])
        drafts = []
        for j, (seq, r) in enumerate(zip(sequences, rows)):
            self._own[r] = own[j]
            if plans[j] is None or any(own[j][i] is not None for i, gated in enumerate(self._gated) if gated):
                plans[j] = self._plan(own[j], values[j], tree, int(seq[0, -1]))
                self._merged_cost[r] = plans[j][5]
            tokens, parents, scores, keep, _, _ = plans[j]
            drafts.append(kept_draft(tokens, parents, scores, keep, seq.device))
        return drafts

    def _learn_gains(self, r: int, committed: list[int]) -> None:
        """Each gated part that drafted for row ``r``: the tokens accepted beyond the free plan's (`DraftGate`)."""
        if r not in self._free:
            return
        tokens, parents, _, keep, tau_free, cost_free = self._free[r]
        gain = len(committed) - 1 - accepted_depth(tokens, parents, keep, committed)
        extra = self._merged_cost.get(r, cost_free) - cost_free  # the merged tree's verification beyond the free plan's
        for i, own in enumerate(self._own.get(r, ())):
            if self._gated[i] and own is not None:
                self.gates[i].observe(tau_free, gain, extra)

    def advance_batch(self, sequences, rows, drafts, results, target_outputs: TargetRows) -> None:
        for r, result in zip(rows, results):
            self._learn_gains(r, result.tokens)
            for i, own in enumerate(self._own.get(r, ())):
                if own is not None:
                    self.accuracy[i].observe_tree(own, result.tokens)
                    if own.scores is not None:
                        self.calibration[i].observe_tree(own, result.tokens)
        for drafter in self.drafters:
            drafter.advance_batch(sequences, rows, drafts, results, target_outputs)

    def end_batch(self) -> None:
        for drafter in self.drafters:
            drafter.end_batch()
        self._own, self._free, self._merged_cost = {}, {}, {}
