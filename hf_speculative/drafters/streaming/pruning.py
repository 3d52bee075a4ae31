"""Parallel tree pruning (Speculative Streaming, Sec. 3.1.3): drop unlikely tree nodes halfway through the
verification forward. The drafter's `prune_batch` hook decides with the functions here; the engine applies its
answer inside its one forward (`hf_speculative.engine.tree_forward`).

The tree draft enters the target's forward whole. After ``pruning_layer`` (l) decoder layers, an early exit
(the base's final norm and ``lm_head`` on the layer-l state plus a rank-theta adapter) gives every inner node
a cheap estimate of the next-token distribution, so every node gets an estimated transition probability
``p_l(token | parent)``. Nodes below ``pruning_threshold`` are pruned together with their subtrees, and
layers l..N-1 (the MSA layers among them) run on the kept nodes only. The layers below l have already
cached keys/values for every node; they are compacted to the kept nodes before the upper layers run, so at
the end of the forward every layer caches exactly the kept nodes (the paper's lazy backtracking, done before
the step's acceptance instead of after it).

Pruning only removes candidates; every kept node is still verified by the full model with exactly its
ancestors visible, so greedy output is unchanged. Removing sampled candidates by a rule on their tokens would
bias tree rejection sampling, so pruning applies to greedy drafts only.

Training the early exit is in `training_pruning` (it needs the Trainer stack, which inference does not).
"""

from __future__ import annotations

import torch

from ...engine.logits import vocab_logits
from ...engine.trees import DraftTree

__all__ = [
    "early_exit_states",
    "transition_probabilities",
    "prune_tree",
]


def early_exit_states(ss, hidden: torch.Tensor) -> torch.Tensor:
    """Final-normed early-exit states of layer-l states ``(..., H)``: ``norm(h + adapter_theta(h))``."""
    adapter = ss.streams.pruning
    h = hidden.to(ss.lm_head.weight.dtype)
    return ss.model.norm(h + adapter(h))


def transition_probabilities(ss, hidden: torch.Tensor, draft: DraftTree) -> torch.Tensor:
    """``(n,)`` estimated ``p_l(token_i | parent_i)`` of every node from the layer-l states ``(n, H)`` of the
    tree nodes (1 at the root); the vocabulary projection runs on the inner nodes only."""
    n = len(draft)
    probs = torch.ones(n, device=hidden.device)
    if n == 1:
        return probs
    inner = sorted(set(draft.parents[1:]))
    row = {node: i for i, node in enumerate(inner)}
    logits = vocab_logits(early_exit_states(ss, hidden[inner]), ss.lm_head.weight).float()
    log_probs = torch.log_softmax(logits, dim=-1)
    rows = torch.tensor([row[p] for p in draft.parents[1:]], device=hidden.device)
    probs[1:] = log_probs[rows, draft.tokens[1:].to(hidden.device)].exp()
    return probs


def prune_tree(draft: DraftTree, probs: torch.Tensor, threshold: float) -> list[int]:
    """Ascending indices of the nodes kept: the root, and every node whose parent is kept and whose
    transition probability ``probs[i]`` is at least ``threshold`` (a pruned node takes its subtree along)."""
    kept = [0]
    alive = [True] + [False] * (len(draft) - 1)
    for node in range(1, len(draft)):
        parent = draft.parents[node]
        if parent >= node:
            raise ValueError("prune_tree needs every parent listed before its children")
        if alive[parent] and float(probs[node]) >= threshold:
            alive[node] = True
            kept.append(node)
    return kept
