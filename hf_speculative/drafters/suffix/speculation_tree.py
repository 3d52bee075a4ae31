"""Speculation trees of SuffixDecoding (Oliaro et al., arXiv 2411.04975, "Speculation Tree Expansion" and
"Speculation Tree Scoring"): from the occurrences of a match, the continuations seen most often, best first.

A node's score ``D(N)`` is the empirical probability that its token follows its path: the share of the parent's
occurrences that go on with this token, multiplied along the path (``count(path) / count(match)``). Scores never
grow along a path, so expanding the frontier best first keeps the ``budget`` best nodes with their ancestors.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["expand_speculation_tree"]


def _children(codes: np.ndarray, positions: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """``(count, code, next positions)`` of each code read at ``positions`` (0 or past the end: the occurrence
    stops), most frequent first."""
    if len(positions) == 1:  # one occurrence: no counting (long exact matches are chains)
        p = int(positions[0])
        code = int(codes[p]) if p < len(codes) else 0
        return [(1, code, positions + 1)] if code else []
    positions = positions[positions < len(codes)]
    read = codes[positions].astype(np.int64)
    keep = read != 0
    positions, read = positions[keep], read[keep]
    if not len(read):
        return []
    values, inverse, counts = np.unique(read, return_inverse=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return [(int(counts[i]), int(values[i]), positions[inverse == i] + 1) for i in order]


def expand_speculation_tree(
    codes: np.ndarray, positions: np.ndarray, root: int, budget: int, max_depth: int, min_probability: float
) -> tuple[list[int], list[int], list[float]]:
    """The greedy expansion: from the occurrences of a match (``positions`` of what follows each, in ``codes``,
    ``token + 1`` with 0 ending a text), at most ``budget`` nodes of at most ``max_depth`` levels below ``root``, each
    with probability at least ``min_probability``. Returns ``(tokens, parents, scores)``, the root first (score 1),
    parents before children."""
    tokens, parents, scores, depths = [root], [-1], [1.0], [0]
    frontier: list[tuple[float, int, int, int, np.ndarray]] = []  # (-score, tie, parent node, code, positions)
    tie = 0

    def push(node: int, occurrences: np.ndarray) -> None:
        nonlocal tie
        if depths[node] >= max_depth:
            return
        total = len(occurrences)
        for count, code, following in _children(codes, occurrences):
            score = scores[node] * (count / total)  # a factor <= 1 first: never above the parent's, rounding included
            if score >= min_probability:
                heapq.heappush(frontier, (-score, tie, node, code, following))
                tie += 1

    push(0, positions)
    while frontier and len(tokens) - 1 < budget:
        neg_score, _, parent, code, following = heapq.heappop(frontier)
        tokens.append(code - 1)
        parents.append(parent)
        scores.append(-neg_score)
        depths.append(depths[parent] + 1)
        push(len(tokens) - 1, following)
    return tokens, parents, scores
