"""Acceptance over a verified draft tree: greedy, lossless rejection sampling, and typical acceptance.

Each function walks the tree from the root. ``node_scores(i)`` returns the target's *processed* scores
(the logits after the same logits processors and warpers that `generate` applies) for the token that
follows node i, given the committed prefix and the path to i. The walk commits the drafted tokens of
the accepted path and one more token from the target at its end (the *bonus* token), so every target
forward commits at least one token.

Lossless sampling (`accept_sampling`) is sequential rejection over a node's children (SpecInfer,
Miao et al. 2023; "iterative speculative sampling"; ParallelSpec Algorithm 1), in the general form of
recursive rejection sampling (Jeon et al. 2024): child i was drawn from a proposal ``q_i`` that may
depend on the earlier siblings; it is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``, and on
rejection ``p_{i+1} = normalize(max(p_i - q_i, 0))``. If every child is rejected the token is drawn from
the last residual. For each i this leaves the committed token distributed exactly as p, provided x_i
really is a draw from q_i given the earlier rejections. The proposal follows from how the drafter drew
the siblings (`DraftTree.sampling`):

* ``"with_replacement"``: i.i.d. draws, ``q_i = q``.
* ``"without_replacement"``: ``q_i = q`` with the earlier siblings' tokens removed and renormalized.
* ``"deterministic"``: fixed candidates such as top-k tokens, ``q_i = onehot(x_i)``. Then x_i is
  accepted with probability ``p_i(x_i)`` and the residual is p_i without x_i.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .trees import DraftTree

__all__ = ["AcceptanceResult", "AcceptanceSettings", "accept_greedy", "accept_greedy_all", "accept_sampling", "accept_typical"]

NodeScores = Callable[[int], torch.Tensor]


@dataclass
class AcceptanceResult:
    """The accepted path (node indices, root first) and the tokens it commits (path tokens + bonus)."""

    path: list[int]
    tokens: list[int]
    scores: list[torch.Tensor] = field(default_factory=list)  # processed scores behind each committed token

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.path) - 1


@dataclass(frozen=True)
class AcceptanceSettings:
    """How one call accepts drafted tokens: ``mode`` ``"exact"`` (greedy argmax, lossless rejection sampling) or
    ``"typical"`` (Medusa 2.3.1, lossy, sampling only) with its ``posterior_threshold`` / ``posterior_alpha``."""

    mode: str = "exact"
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3

    @classmethod
    def resolve(cls, acceptance: "str | AcceptanceSettings | None", config=None) -> "AcceptanceSettings":
        """The call's ``speculative_acceptance``, else the drafter model's config (``acceptance``, ``posterior_*``
        saved with Medusa heads and ParallelSpec drafters), else exact acceptance."""
        if isinstance(acceptance, AcceptanceSettings):
            return acceptance
        mode = acceptance if acceptance is not None else getattr(config, "acceptance", None) or "exact"
        if mode not in ("exact", "typical"):
            raise ValueError(f"speculative_acceptance must be 'exact' or 'typical', got {mode!r}")
        return cls(mode, getattr(config, "posterior_threshold", cls.posterior_threshold), getattr(config, "posterior_alpha", cls.posterior_alpha))

    def acceptor(self, do_sample: bool, generator: torch.Generator | None = None) -> Callable[[DraftTree, NodeScores], AcceptanceResult]:
        """The acceptance function of a call: greedy (typical acceptance at T = 0 is greedy, Medusa 2.3.1), exact
        rejection sampling, or typical acceptance."""
        if not do_sample:
            return accept_greedy
        if self.mode == "typical":
            return lambda tree, scores: accept_typical(tree, scores, self.posterior_threshold, self.posterior_alpha, True, generator)
        return lambda tree, scores: accept_sampling(tree, scores, generator)


def accept_greedy_all(tree: DraftTree, logits: torch.Tensor) -> AcceptanceResult:
    """`accept_greedy` from every node's logits ``(n, V)`` at once, in tensor ops and one host sync: a node is valid
    when each node on its path is its parent's argmax; the deepest valid node ends the accepted path (EAGLE's
    acceptance over all leaf paths). Siblings hold distinct tokens, so at most one path is valid per depth."""
    best = logits.argmax(-1)
    tokens = tree.tokens.to(best.device)
    parents = torch.tensor(tree.parents[1:], device=best.device, dtype=torch.long)
    match = torch.ones(len(tree), dtype=torch.bool, device=best.device)
    match[1:] = tokens[1:] == best[parents]
    ancestors = tree.ancestors.to(best.device)
    valid = ~(ancestors & ~match).any(-1)
    depth = torch.where(valid, tree.depths.to(best.device), -1)
    node = int(depth.argmax())  # the host sync; the first deepest valid node in node order
    path = ancestors[node].nonzero().squeeze(-1).tolist()  # parents precede children: root first
    out = [int(t) for t in tokens[path[1:]].tolist()] + [int(best[node])]
    return AcceptanceResult(path, out, [logits[i].float() for i in path])


def accept_greedy(tree: DraftTree, node_scores: NodeScores) -> AcceptanceResult:
    """Follow the target's argmax through the tree (speculative decoding notes, Appendix A)."""
    tokens = tree.tokens.tolist()
    node, path, out, scores = 0, [0], [], []
    while True:
        s = node_scores(node)
        best = int(torch.argmax(s))
        out.append(best)
        scores.append(s)
        child = next((c for c in tree.children[node] if tokens[c] == best), None)
        if child is None:
            return AcceptanceResult(path, out, scores)
        path.append(child)
        node = child


def _proposal(tree: DraftTree, node: int, removed: list[int], device) -> torch.Tensor:
    """q_i for the next sibling of a sampled draft, following `DraftTree.sampling` (not ``deterministic``)."""
    if tree.draft_probs is None:
        raise ValueError(f"a DraftTree sampled {tree.sampling} needs draft_probs for lossless sampling")
    q = tree.draft_probs[node].to(device=device, dtype=torch.float32)
    if tree.sampling == "without_replacement" and removed:
        q = q.clone()
        q[removed] = 0.0
        total = q.sum()
        q = q / total if total > 0 else q
    return q


def accept_sampling(
    tree: DraftTree, node_scores: NodeScores, generator: torch.Generator | None = None
) -> AcceptanceResult:
    """Lossless tree rejection sampling: the committed tokens follow the target's own distribution.

    For ``deterministic`` candidates ``q_i = onehot(x_i)``: x_i is accepted with probability ``p_i(x_i)`` and
    the residual is p_i without x_i, renormalized (computed in place, no one-hot tensor per node).
    """
    tokens = tree.tokens.tolist()
    deterministic = tree.sampling == "deterministic"
    node, path, out, scores = 0, [0], [], []
    while True:
        s = node_scores(node)
        p = torch.softmax(s.float(), dim=-1)
        accepted, removed = None, []
        for child in tree.children[node]:
            x = tokens[child]
            u = float(torch.rand((), generator=generator, device="cpu"))
            if deterministic:
                px = float(p[x])
                if u < px:
                    accepted = child
                    break
                if px < 1.0:  # px == 1 would always accept
                    p = p.clone()
                    p[x] = 0.0
                    p = p / (1.0 - px)
            else:
                q = _proposal(tree, node, removed, p.device)
                qx, px = float(q[x]), float(p[x])
                if qx > 0 and u * qx < px:
                    accepted = child
                    break
                residual = torch.clamp(p - q, min=0.0)
                total = residual.sum()
                if total > 0:  # total == 0 would need p == q, where the child is always accepted
                    p = residual / total
            removed.append(x)
        scores.append(s)
        if accepted is None:
            out.append(int(torch.multinomial(p, 1, generator=generator)))
            return AcceptanceResult(path, out, scores)
        out.append(tokens[accepted])
        path.append(accepted)
        node = accepted


def accept_typical(
    tree: DraftTree,
    node_scores: NodeScores,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    do_sample: bool = True,
    generator: torch.Generator | None = None,
) -> AcceptanceResult:
    """Typical acceptance (Medusa Sec. 2.3.1). LOSSY: it does not preserve the target's distribution.

    A drafted token x after a prefix is accepted when ``p(x) > min(epsilon, alpha * exp(-H(p)))`` with
    p the target's (temperature-scaled) distribution; the longest accepted path wins (ties: the earlier
    path in tree order). The bonus token is sampled from p at the end of the path (argmax when
    ``do_sample`` is False).
    """
    tokens = tree.tokens.tolist()
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def probs(node: int):
        if node not in cache:
            s = node_scores(node)
            cache[node] = (s, torch.softmax(s.float(), dim=-1))
        return cache[node]

    def longest(node: int) -> list[int]:
        _, p = probs(node)
        entropy = -(p * torch.log(p.clamp_min(1e-20))).sum()
        threshold = min(posterior_threshold, posterior_alpha * float(torch.exp(-entropy)))
        best: list[int] = []
        for child in tree.children[node]:
            if float(p[tokens[child]]) > threshold:
                below = [child] + longest(child)
                if len(below) > len(best):
                    best = below
        return best

    path = [0] + longest(0)
    out = [tokens[i] for i in path[1:]]
    scores = [probs(i)[0] for i in path]
    s, p = probs(path[-1])
    out.append(int(torch.multinomial(p, 1, generator=generator)) if do_sample else int(torch.argmax(s)))
    return AcceptanceResult(path, out, scores)
