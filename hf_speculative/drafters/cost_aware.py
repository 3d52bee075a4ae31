"""The default tree of a calibrated drafter: the fastest tree for this target on this machine.

A drafter calibrated on held-out data stores its per-depth top-i accuracies in ``config.calibration``.
With the target's measured cost curve c(N) (`hf_speculative.perf_model`) and the drafter's own cost per
step, `TreeSpec.optimize(..., cost=)` picks the tree with the largest expected tau / (c(N + 1) + drafting)
(Medusa 2.3.3's greedy build with the cost term of Sequoia and SPIRe). The curve is measured once per
machine, dtype and model and cached; `perf_model.set_cost_curve` injects a fixed one.

Opt out per drafter with ``config.cost_aware_tree = False``, or everywhere with the environment variable
``HF_SPECULATIVE_COST_AWARE=0``: the drafter then uses its saved tree. A call's ``speculative_tree=``
always wins.
"""

from __future__ import annotations

import os
from typing import Callable

from transformers.utils import logging

from ..trees import TreeSpec

__all__ = ["COST_AWARE_ENV", "cost_aware_enabled", "cost_aware_tree"]

logger = logging.get_logger(__name__)

COST_AWARE_ENV = "HF_SPECULATIVE_COST_AWARE"


def cost_aware_enabled(config) -> bool:
    """False when ``$HF_SPECULATIVE_COST_AWARE`` is 0/false/off or the config sets ``cost_aware_tree=False``."""
    if os.environ.get(COST_AWARE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return bool(getattr(config, "cost_aware_tree", True))


def cost_aware_tree(
    saved: TreeSpec,
    config,
    accuracy_key: str,
    target,
    draft_cost: Callable | float = 0.0,
    max_depth: int | None = None,
    max_nodes: int | None = None,
) -> TreeSpec:
    """The drafter's default tree: ``saved`` unless ``config.calibration[accuracy_key]`` holds accuracies and
    cost-aware trees are enabled; then the tree that maximizes expected tau per unit of cost on ``target``.

    ``draft_cost``: the drafter's cost per step in plain steps, or ``f(curve)`` returning it (a number, a
    per-depth list or ``g(num_nodes, depth)``, as `TreeSpec.optimize` takes) when it depends on the measured
    curve (e.g. its vocabulary projections: `CostCurve.projection_cost`). ``max_nodes`` defaults to the
    largest measured forward minus the root.
    """
    accuracies = (getattr(config, "calibration", None) or {}).get(accuracy_key)
    if not accuracies or target is None or not cost_aware_enabled(config):
        return saved
    from ..perf_model import get_cost_curve

    curve = get_cost_curve(target)
    if curve is None:
        return saved
    cost = draft_cost(curve) if callable(draft_cost) else draft_cost
    accuracies = accuracies[:max_depth] if max_depth is not None else accuracies
    tree = TreeSpec.optimize(accuracies, max_nodes or max(curve.max_nodes - 1, 1), cost=curve, draft_cost=cost)
    speedup = tree.expected_speedup(accuracies, curve, cost)
    message = f"cost-aware default tree: {tree.num_nodes} nodes, depth {tree.depth}, expected tau / step cost {speedup:.2f}"
    if speedup < 1:  # once per message, not once per generate() call
        logger.warning_once(f"{message}: no tree pays for itself with these accuracies on this machine")
    else:
        logger.info(message)
    return tree
