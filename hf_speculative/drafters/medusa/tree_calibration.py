"""Calibrated sparse trees (Medusa Sec. 2.3.3).

Measure, on held-out data, each head's top-i accuracy ``a[k][i]``: the share of positions where the i-th
ranked token of head k is the right one. Under the paper's independence assumption a tree node's chance of
being accepted is the product of the accuracies along its path, and `TreeSpec.optimize` greedily builds the
tree of a given node budget with the largest expected acceptance length; the result goes to the config.
"""

from __future__ import annotations

import torch

from ...engine.trees import TreeSpec, expected_acceptance_length
from ...training.callbacks import LearningCurveCallback
from .training_medusa import IGNORE_INDEX, medusa_labels

__all__ = ["head_accuracies", "expected_acceptance_length", "calibrate_tree", "MedusaCurveCallback"]


@torch.no_grad()
def head_accuracies(heads, states, top: int = 10, batch_size: int = 512) -> list[list[float]]:
    """``acc[k][i]``: share of held-out positions where head k's i-th ranked token is the label.

    ``states``: `HiddenStates` of held-out conversations (``hf_speculative.training.trainer``).
    """
    K = heads.config.num_heads
    labels = medusa_labels(states.labels, K, states.offsets)
    hits = torch.zeros(K, top, dtype=torch.float64)
    counts = torch.zeros(K, dtype=torch.float64)
    for s in range(0, labels.shape[0], batch_size):
        y = labels[s : s + batch_size]
        if not bool((y != IGNORE_INDEX).any()):
            continue
        h = states.hidden[s : s + batch_size].to(device=heads.device, dtype=heads.dtype)  # cached on the CPU
        ranked = torch.topk(heads(h).logits, top, dim=-1).indices.cpu()  # (B, K, top)
        match = ranked == y[..., None]
        valid = y != IGNORE_INDEX
        hits += (match & valid[..., None]).sum(0).double()
        counts += valid.sum(0).double()
    acc = hits / counts.clamp_min(1)[:, None]
    return acc.tolist()


def calibrate_tree(heads, states, num_nodes: int = 32, top: int = 10) -> TreeSpec:
    """Measure the heads' accuracies on ``states``, build the tree for ``num_nodes`` and store it (and the
    table) in ``heads.config`` (``medusa_choices``, ``calibration``: `TreeDrafterConfig.calibrate`)."""
    acc = head_accuracies(heads, states, top=top)
    num_positions = int((states.labels != IGNORE_INDEX).sum())
    return heads.config.calibrate(acc, num_nodes, "head_top_i_accuracy", num_positions=num_positions)


class MedusaCurveCallback(LearningCurveCallback):
    """The heads' learning curve (`LearningCurveCallback`): per-head top-1 accuracy against positions trained on
    (``batch_size`` per step)."""

    seen_key, top1_key = "train_positions", "head_top1"
    per_step_key, default_num_nodes, default_num_points, default_per_step = "batch_size", 32, 5, 64

    def accuracies(self) -> list[list[float]]:
        return head_accuracies(self.model, self.held_out)
