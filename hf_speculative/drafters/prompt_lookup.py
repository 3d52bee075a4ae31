"""Prompt lookup as a TREE drafter: n-gram matches in the context propose continuations for free.

Prompt lookup decoding (Saxena, 2023; transformers' ``prompt_lookup_num_tokens``) finds the last n tokens
of the sequence earlier in the sequence (prompt and generated text) and drafts what followed that
earlier occurrence, as one chain. It costs no model forward, which makes it the strongest baseline
on CPUs where any draft model eats the gain. As a tree drafter every earlier occurrence contributes
its continuation, merged into a trie (shared prefixes become one path), so one verification forward
checks several candidate continuations at once.

The call's tree (``speculative_tree=``, else `default_tree`) is a budget here, not a shape: the drafted
trie has at most ``tree.num_nodes`` nodes (root excluded) and at most ``tree.depth`` levels. Longer
n-grams are matched first (more specific context), then shorter ones fill what budget is left;
within one n-gram size the most recent occurrence comes first. Without a match the draft is the root
alone and the step is a plain decoding step.

Drafts are fixed choices (``sampling="deterministic"``), so sampling stays exact through the engine's
rejection step with point-mass q.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from ..engine.protocol import OneRowDrafter
from ..engine.trees import DraftingOptions, DraftTree, TreeSpec

__all__ = ["PromptLookupDrafter", "ngram_continuations", "build_trie"]


def ngram_continuations(
    sequence: np.ndarray, max_ngram_size: int, min_ngram_size: int, depth: int, max_candidates: int
) -> list[list[int]]:
    """Continuations (each up to ``depth`` tokens) of earlier occurrences of the sequence's last n-gram.

    n runs from ``max_ngram_size`` down to ``min_ngram_size``; per n the most recent occurrence first.
    An occurrence must be followed by at least one token (the final n-gram itself never matches), and
    an occurrence already found with a longer n-gram is not counted again.
    """
    length = len(sequence)
    out: list[list[int]] = []
    seen: set[int] = set()  # positions where a found continuation starts
    for n in range(min(max_ngram_size, length - 1), min_ngram_size - 1, -1):
        suffix = sequence[-n:]
        windows = sliding_window_view(sequence[:-1], n)  # starts 0 .. length-1-n: each has a follower
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        for start in starts[::-1]:
            if start + n in seen:
                continue
            seen.add(start + n)
            out.append(sequence[start + n : start + n + depth].tolist())
            if len(out) >= max_candidates:
                return out
    return out


def build_trie(root_token: int, continuations: list[list[int]], num_nodes: int) -> tuple[list[int], list[int]]:
    """Merge continuations into a trie below ``root_token`` with at most ``num_nodes`` new nodes.

    Returns ``(tokens, parents)`` in insertion order (node 0 = root, parent -1); a parent always comes
    before its children, as `DraftTree` requires. A continuation that no longer fits is cut short.
    """
    tokens, parents = [root_token], [-1]
    children: list[dict[int, int]] = [{}]
    for cont in continuations:
        node = 0
        for token in cont:
            nxt = children[node].get(token)
            if nxt is None:
                if len(tokens) - 1 >= num_nodes:
                    break
                nxt = len(tokens)
                tokens.append(token)
                parents.append(node)
                children.append({})
                children[node][token] = nxt
            node = nxt
        if len(tokens) - 1 >= num_nodes:
            break
    return tokens, parents


class PromptLookupDrafter(OneRowDrafter):
    """A model-free tree drafter from n-gram matches in the context (see the module docstring).

    Use it like any drafter::

        out = model.generate(input_ids, assistant_model=hfs.PromptLookupDrafter(), max_new_tokens=128)

    Args:
        max_ngram_size: longest suffix n-gram looked up (transformers' ``max_matching_ngram_size``).
        min_ngram_size: shortest one (default 2: single-token matches give many weak candidates, and on
            a CPU a tree of them costs more than it gains: 6 MT-Bench prompts, 0.99x with 1, 1.02x with 2).
        max_candidates: earlier occurrences considered per step.
        default_tree: the node / depth budget when a call gives no ``speculative_tree``; None (default): up to
            `MAX_DEPTH` levels (transformers' prompt lookup drafts 10 tokens) and as many nodes, up to `MAX_NODES`, as a
            forward verifies for at most `NODE_COST_LIMIT` one-token steps on the target's cost curve (set when a call
            attaches the target).
    """

    MAX_DEPTH = 10
    MAX_NODES = 40
    NODE_COST_LIMIT = 1.3

    def __init__(
        self,
        max_ngram_size: int = 3,
        min_ngram_size: int = 2,
        max_candidates: int = 8,
        default_tree: TreeSpec | None = None,
    ):
        if not 1 <= min_ngram_size <= max_ngram_size:
            raise ValueError(f"need 1 <= min_ngram_size <= max_ngram_size, got {min_ngram_size}, {max_ngram_size}")
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
        self.max_ngram_size = max_ngram_size
        self.min_ngram_size = min_ngram_size
        self.max_candidates = max_candidates
        self._cost_aware_budget = default_tree is None
        # until a target is attached: 24 nodes, 6 levels (a Cartesian spec is only read for its size and depth)
        self.default_tree = default_tree if default_tree is not None else TreeSpec.cartesian([4, 1, 1, 1, 1, 1])

    def attach_target(self, target) -> None:
        """The default budget from the target's cost curve (cached, else the documented default; never measured)."""
        if not self._cost_aware_budget:
            return
        from ..engine.trees import budget_tree
        from .cost_aware import target_cost_curve

        curve = target_cost_curve(target)
        nodes = max([n for n in range(4, self.MAX_NODES + 1) if curve(n + 1) <= self.NODE_COST_LIMIT], default=4)
        self.default_tree = budget_tree(nodes, min(self.MAX_DEPTH, nodes))

    @torch.no_grad()
    def propose(self, sequence: torch.LongTensor, tree: TreeSpec, options: DraftingOptions) -> DraftTree:
        seq = sequence[0].cpu().numpy()
        conts = ngram_continuations(seq, self.max_ngram_size, self.min_ngram_size, tree.depth, self.max_candidates)
        tokens, parents = build_trie(int(seq[-1]), conts, tree.num_nodes)
        return DraftTree(tokens=torch.tensor(tokens, device=sequence.device), parents=tuple(parents))
