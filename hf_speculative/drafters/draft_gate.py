"""The gate of `HybridDrafter`: does a part that costs drafting time (EAGLE, Medusa heads, a draft model) draft for
a row this step?

The free parts (prompt lookup, SuffixDecoding, Token Recycling) draft first; their merged plan expects ``tau_free``
tokens at a verification cost of ``cost_free`` plain steps. Drafting the costly part adds ``d`` steps of drafting,
``e`` steps of verification (the merged tree's nodes beyond the free plan's, on the target's cost curve) and some
expected tokens ``g``, its gain over the free plan. It pays when ``(tau_free + g) / (cost_free + d + e)`` beats
``tau_free / cost_free``, that is when ``g > tau_free * (d + e) / cost_free``.

The gain is measured, not guessed: after each verification of a row the part drafted for, the gate compares the
tokens accepted with the tokens the free plan alone would have accepted (`accepted_depth`). The gain depends on how
good the free plan is (a long suffix match leaves little to add; no match leaves everything), so it is kept per band
of ``tau_free`` (`TAU_EDGES`): a mean that starts from an optimistic prior (`PRIOR_GAIN`, worth `PRIOR_ROWS` rows,
so a band drafts until its rows show otherwise) and forgets old rows slowly (`DECAY`: about the last hundred count),
so it follows a part whose acceptance changes. The extra verification cost ``e`` is measured the same way, per band
(the merged plan's cost less the free plan's, starting from 0). A band that skips still drafts once in
`EXPLORE_EVERY` rows.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["DraftGate", "accepted_depth"]

#: edges of the bands of the free plan's expected tokens per step
TAU_EDGES = (1.25, 1.5, 2.0, 3.0)
#: a band's gain before any row: optimistic (the part drafts), worth PRIOR_ROWS measured rows
PRIOR_GAIN = 1.0
PRIOR_ROWS = 4.0
#: each new row multiplies the weight of the older ones by this (an effective memory of 1 / (1 - DECAY) rows)
DECAY = 0.99
#: a band that skips still drafts once in this many rows
EXPLORE_EVERY = 16


def accepted_depth(tokens: list[int], parents: list[int], nodes: list[int], committed: list[int]) -> int:
    """How many drafted tokens a tree would have accepted: the depth of its deepest node on the committed path (the
    tree is ``nodes`` of the trie ``tokens``/``parents``, ascending, parents first; ``committed``: the step's
    accepted drafts then its bonus token)."""
    depth = {0: 0}
    best = 0
    for node in nodes[1:]:
        parent = parents[node]
        if parent in depth:
            d = depth[parent] + 1
            if d <= len(committed) and tokens[node] == committed[d - 1]:
                depth[node] = d
                best = max(best, d)
    return best


class DraftGate:
    """One costly part's gate (see the module docstring)."""

    def __init__(self):
        bands = len(TAU_EDGES) + 1
        self.total = [PRIOR_GAIN * PRIOR_ROWS] * bands  # decayed sum of the measured gains per band, prior included
        self.rows = [PRIOR_ROWS] * bands  # decayed count of rows per band, prior included
        self.extra = [0.0] * bands  # decayed sum of the measured extra verification costs per band (prior: 0)
        self.skips = [0] * bands  # rows skipped per band since its last exploration

    @staticmethod
    def band(tau_free: float) -> int:
        return bisect_right(TAU_EDGES, tau_free)

    def gain(self, tau_free: float) -> float:
        """The expected gain of drafting for a row whose free plan expects ``tau_free`` tokens."""
        b = self.band(tau_free)
        return self.total[b] / self.rows[b]

    def extra_cost(self, tau_free: float) -> float:
        """The expected extra verification cost (plain steps) of the merged tree over the free plan, for a row whose
        free plan expects ``tau_free`` tokens."""
        b = self.band(tau_free)
        return self.extra[b] / self.rows[b]

    def wants(self, tau_free: float, cost_free: float, drafting: float) -> bool:
        """Whether the part drafts for a row whose free plan expects ``tau_free`` tokens at ``cost_free`` steps; its
        drafting costs ``drafting`` steps."""
        if self.gain(tau_free) > tau_free * (drafting + self.extra_cost(tau_free)) / cost_free:
            return True
        b = self.band(tau_free)
        self.skips[b] += 1
        if self.skips[b] >= EXPLORE_EVERY:
            self.skips[b] = 0
            return True
        return False

    def observe(self, tau_free: float, gain: float, extra_cost: float = 0.0) -> None:
        """A measured gain (tokens accepted beyond the free plan's) and extra verification cost (the merged plan's
        cost less the free plan's, in plain steps) for a row whose free plan expected ``tau_free``."""
        b = self.band(tau_free)
        self.total[b] = DECAY * self.total[b] + float(gain)
        self.extra[b] = DECAY * self.extra[b] + float(extra_cost)
        self.rows[b] = DECAY * self.rows[b] + 1.0
