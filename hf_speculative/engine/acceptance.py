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

__all__ = [
    "AcceptanceResult",
    "AcceptanceSettings",
    "accept_greedy",
    "accept_greedy_all",
    "accept_keyed",
    "accept_sampling",
    "accept_typical",
]

NodeScores = Callable[[int], torch.Tensor]
Acceptor = Callable[..., "AcceptanceResult"]
ACCEPTANCE_MODES = ("exact", "rejection", "typical")


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
    """How one call accepts drafted tokens: ``mode`` ``"exact"`` (greedy argmax; sampling keyed by position,
    `accept_keyed`: exact and reproducible whatever the steps drafted), ``"rejection"`` (tree rejection sampling over
    the drafters' own sampled siblings, `accept_sampling`: exact, with higher acceptance for sampled drafts, but the
    randomness a call consumes depends on its steps) or ``"typical"`` (Medusa 2.3.1, lossy, sampling only) with its
    ``posterior_threshold`` / ``posterior_alpha``."""

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
        if mode not in ACCEPTANCE_MODES:
            raise ValueError(
                f"speculative_acceptance must be one of {', '.join(map(repr, ACCEPTANCE_MODES))}, got {mode!r}"
            )
        return cls(
            mode,
            getattr(config, "posterior_threshold", cls.posterior_threshold),
            getattr(config, "posterior_alpha", cls.posterior_alpha),
        )

    def acceptor(self, do_sample: bool, generator: torch.Generator | None = None, noise=None) -> Acceptor:
        """The acceptance function of a call, ``walk(tree, node_scores, row, position)``: greedy (typical acceptance
        at T = 0 is greedy, Medusa 2.3.1), sampling keyed by position (``noise``, a `PositionNoise`), exact rejection
        sampling, or typical acceptance. ``position``: the index of the token after the root in ``row``."""
        if not do_sample:
            return lambda tree, scores, row=0, position=0: accept_greedy(tree, scores)
        if self.mode == "typical":
            return lambda tree, scores, row=0, position=0: accept_typical(
                tree,
                scores,
                self.posterior_threshold,
                self.posterior_alpha,
                True,
                generator,
                draw=None if noise is None else lambda s, depth: noise.sample(row, position + depth, s),
            )
        if self.mode == "rejection" or noise is None:
            return lambda tree, scores, row=0, position=0: accept_sampling(tree, scores, generator)
        return lambda tree, scores, row=0, position=0: accept_keyed(tree, scores, noise, row, position)


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
    node = depth.argmax()  # the first deepest valid node in node order
    n = len(tree)
    packed = torch.cat([node.view(1), ancestors[node].long(), tokens, best]).tolist()  # the one host sync
    node, on_path, tokens, best = packed[0], packed[1 : 1 + n], packed[1 + n : 1 + 2 * n], packed[1 + 2 * n :]
    path = [i for i in range(n) if on_path[i]]  # parents precede children: root first
    out = [tokens[i] for i in path[1:]] + [best[node]]
    return AcceptanceResult(path, out, [logits[i].float() for i in path])


def accept_greedy(tree: DraftTree, node_scores: NodeScores) -> AcceptanceResult:
    """Follow the target's argmax through the tree (speculative decoding notes, Appendix A)."""
    return _follow_target(tree, node_scores, lambda node, s: int(torch.argmax(s)))


def accept_keyed(tree: DraftTree, node_scores: NodeScores, noise, row: int, position: int) -> AcceptanceResult:
    """Exact sampling keyed by position (`hf_speculative.engine.sampling_noise`): at each node the target's token is
    ``argmax(scores + G)``, ``G`` the noise of that node's position; the child holding it is accepted, else it is the
    bonus token. Every committed token is the one plain sampling with the same noise would draw."""
    depths = tree.depths.tolist()
    return _follow_target(tree, node_scores, lambda node, s: int(noise.sample(row, position + depths[node], s)))


def _follow_target(tree: DraftTree, node_scores: NodeScores, choose) -> AcceptanceResult:
    """The path of the target's own tokens through the tree: from the root, the target's token at a node is
    ``choose(node, scores)``; the child holding it is accepted, else that token is the bonus token and the path
    ends."""
    tokens = tree.tokens.tolist()
    node, path, out, scores = 0, [0], [], []
    while True:
        s = node_scores(node)
        token = choose(node, s)
        out.append(token)
        scores.append(s)
        child = next((c for c in tree.children[node] if tokens[c] == token), None)
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
        q = q / torch.where(total > 0, total, 1.0)  # all removed: q stays 0 (no host read)
    return q


def _test_one_hot_children(p: torch.Tensor, xs: list[int], generator) -> tuple[int | None, torch.Tensor]:
    """Deterministic candidates (``q_i = onehot(x_i)``) of one node, in rank order: x_i is accepted with probability
    ``p_i(x_i)``, p_i being p without the earlier candidates, renormalized. One host read: ``p(x_i)`` of all
    candidates at once (``p_i(x_i) = p(x_i) / (1 - sum_{j<i} p(x_j))``). Returns the accepted index (or None) and
    the residual p without the rejected candidates."""
    px = p[xs].tolist()
    seen, rest = set(), 1.0
    for i, x in enumerate(xs):
        u = float(torch.rand((), generator=generator, device="cpu"))
        if x in seen:  # a repeated candidate has probability 0 in the residual
            continue
        if rest > 0 and u < px[i] / rest:
            return i, p
        seen.add(x)
        rest -= px[i]
    residual = p.clone()
    residual[xs] = 0.0
    total = residual.sum()
    return None, residual / torch.where(total > 0, total, 1.0)


def _test_sampled_children(
    tree: DraftTree, node: int, p: torch.Tensor, xs: list[int], generator
) -> tuple[int | None, torch.Tensor]:
    """Sampled candidates (proposal q_i per sibling, `_proposal`) of one node: x_i is accepted when
    ``u_i q_i(x_i) < p_i(x_i)``, else ``p_{i+1} = norm(max(p_i - q_i, 0))``. Every test runs on the device and the
    first accepted index is read once. Returns it (or None) and the residual after every candidate."""
    us = torch.rand(len(xs), generator=generator, device="cpu").to(p.device)
    accepted, removed = [], []
    for i, x in enumerate(xs):
        q = _proposal(tree, node, removed, p.device)
        qx, pxi = q[x], p[x]
        accepted.append((qx > 0) & (us[i] * qx < pxi))
        residual = torch.clamp(p - q, min=0.0)
        total = residual.sum()
        p = torch.where(total > 0, residual / total, p)  # total == 0: p == q, where the child is always accepted
        removed.append(x)
    flags = torch.stack(accepted).tolist()
    first = next((i for i, f in enumerate(flags) if f), None)
    return first, p


def accept_sampling(
    tree: DraftTree, node_scores: NodeScores, generator: torch.Generator | None = None
) -> AcceptanceResult:
    """Lossless tree rejection sampling: the committed tokens follow the target's own distribution.

    For ``deterministic`` candidates ``q_i = onehot(x_i)``: x_i is accepted with probability ``p_i(x_i)`` and
    the residual is p_i without x_i, renormalized (no one-hot tensor per node). One host read per depth, plus the
    final draw from the residual.
    """
    tokens = tree.tokens.tolist()
    deterministic = tree.sampling == "deterministic"
    node, path, out, scores = 0, [0], [], []
    while True:
        s = node_scores(node)
        p = torch.softmax(s.float(), dim=-1)
        children = list(tree.children[node])
        scores.append(s)
        if children:
            xs = [tokens[c] for c in children]
            index, p = (
                _test_one_hot_children(p, xs, generator)
                if deterministic
                else _test_sampled_children(tree, node, p, xs, generator)
            )
        else:
            index = None
        if index is None:
            out.append(int(torch.multinomial(p, 1, generator=generator)))
            return AcceptanceResult(path, out, scores)
        accepted = children[index]
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
    draw: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
) -> AcceptanceResult:
    """Typical acceptance (Medusa Sec. 2.3.1). LOSSY: it does not preserve the target's distribution.

    A drafted token x after a prefix is accepted when ``p(x) > min(epsilon, alpha * exp(-H(p)))`` with
    p the target's (temperature-scaled) distribution; the longest accepted path wins (ties: the earlier
    path in tree order). The bonus token is sampled from p at the end of the path (argmax when
    ``do_sample`` is False); ``draw(scores, depth)``, when given, draws it instead (`accept_keyed`'s noise).
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
    if not do_sample:
        out.append(int(torch.argmax(s)))
    elif draw is not None:
        out.append(int(draw(s, len(path) - 1)))
    else:
        out.append(int(torch.multinomial(p, 1, generator=generator)))
    return AcceptanceResult(path, out, scores)
