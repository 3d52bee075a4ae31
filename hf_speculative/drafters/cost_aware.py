"""The default tree of a calibrated drafter: the fastest tree for this target on this machine.

A drafter calibrated on held-out data stores its per-depth top-i accuracies in ``config.calibration``.
With the target's measured cost curve c(N) (`hf_speculative.perf_model`) and the drafter's own cost per
step, `TreeSpec.optimize(..., cost=)` picks the tree with the largest expected tau / (c(N + 1) + drafting)
(Medusa 2.3.3's greedy build with the cost term of Sequoia and SPIRe). The curve is measured once per
machine, dtype and model when the user asks (``hf-speculative calibrate``, ``perf_model.get_cost_curve(model)``) and
cached; `generate()` only reads the cache (without one the saved tree applies, with a one-line notice);
`perf_model.set_cost_curve` injects a fixed one.

With a batch of B rows the verification forward carries B x (N + 1) tokens and is scored against a plain
batched step, ``c(B (N + 1)) / c(B)``; drafting B rows costs about B times one row's drafting in units of
that batched step (``B c(1) / c(B)``). As B grows the forward leaves the flat part of the curve sooner, so
the chosen trees shrink (`TreeDrafter.tree_for_batch` asks for the tree of a call's batch size).

Opt out per drafter with ``config.cost_aware_tree = False``, or everywhere with the environment variable
``HF_SPECULATIVE_COST_AWARE=0``: the drafter then uses its saved tree. A call's ``speculative_tree=``
always wins.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from transformers.utils import logging

from ..engine.trees import TreeSpec

__all__ = [
    "COST_AWARE_ENV",
    "DEFAULT_COST_CURVE_POINTS",
    "DEFAULT_COST_CURVE_POINTS_BF16",
    "cost_aware_enabled",
    "cost_aware_tree",
    "target_cost_curve",
]

logger = logging.get_logger(__name__)

COST_AWARE_ENV = "HF_SPECULATIVE_COST_AWARE"


#: ``c(n)`` for drafters that size their tree online (Token Recycling, hybrid trees, suffix trees) when the target has no
#: measured curve: a forward over n tokens in one-token steps as the engine runs it (its kernels on), per dtype, as
#: measured with SmolLM2-135M on this project's 2-core Intel Xeon (AMX) with 2 threads (docs/step_cost.md); float32
#: also stands for float16 and for CPUs without native bf16. Measure the machine's own with ``hf-speculative
#: calibrate`` (cached; later calls read it).
DEFAULT_COST_CURVE_POINTS = {1: 1.0, 2: 1.14, 4: 1.18, 8: 1.21, 16: 1.25, 32: 1.48, 64: 2.28}
DEFAULT_COST_CURVE_POINTS_BF16 = {1: 1.0, 2: 1.02, 4: 1.03, 8: 1.03, 16: 1.06, 32: 1.19, 64: 1.45}


def target_cost_curve(target, curve=None):
    """``curve`` when given; else the target's cached cost curve (never measured here: `generate` does no hidden
    work); else the curve of this machine's kernel table, measured at ``hfs.enable``
    (`hf_speculative.perf_model.cost_curve.kernel_table_curve`, an upper bound); else the default curve above, with
    a one-line notice."""
    if curve is not None:
        return curve
    from ..perf_model import CostCurve, get_cost_curve
    from ..perf_model.cost_curve import kernel_table_curve

    cached = get_cost_curve(target, measure_if_missing=False)
    if cached is not None:
        return cached
    derived = kernel_table_curve(target)
    if derived is not None:
        logger.info_once(
            "no measured cost curve for this model: trees are sized with one derived from the kernel table measured at "
            "enable; measure this machine's once with `hf-speculative calibrate --model M`"
        )
        return derived
    logger.warning_once(
        "no measured cost curve for this model: trees are sized with a default one; measure this machine's once with "
        "`hf-speculative calibrate --model M` or `hf_speculative.perf_model.get_cost_curve(model)`"
    )
    from ..engine.kernels import native_bf16

    bf16 = next(target.parameters()).dtype == torch.bfloat16 and native_bf16()
    points = DEFAULT_COST_CURVE_POINTS_BF16 if bf16 else DEFAULT_COST_CURVE_POINTS
    return CostCurve(nodes=tuple(points), ratios=tuple(points.values()), meta={"source": "default"})


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
    batch_size: int = 1,
    accuracies: list[list[float]] | None = None,
    candidates: Callable[[int, int], list[TreeSpec]] | None = None,
) -> TreeSpec:
    """The drafter's default tree: ``saved`` unless ``config.calibration[accuracy_key]`` holds accuracies and
    cost-aware trees are enabled; then the tree that maximizes expected tau per unit of cost on ``target``.

    ``draft_cost``: the drafter's cost per step in plain steps, or ``f(curve)`` returning it (a number, a
    per-depth list or ``g(num_nodes, depth)``, as `TreeSpec.optimize` takes) when it depends on the measured
    curve (e.g. its vocabulary projections: `CostCurve.projection_cost`). ``max_nodes`` defaults to the
    largest measured forward minus the root. ``batch_size``: the tree for B rows verified together (module
    docstring). ``accuracies``: per-rank accuracies to use instead of ``config.calibration[accuracy_key]`` (e.g.
    converted from another form; the key still names what they come from). ``candidates(max_depth, max_nodes)``:
    score only these trees (the shapes a drafter conditions exactly, e.g. SPIRe's chain with alternatives) instead of
    growing one with `TreeSpec.optimize`.
    """
    if accuracies is None:
        accuracies = (getattr(config, "calibration", None) or {}).get(accuracy_key)
    if not accuracies or target is None or not cost_aware_enabled(config):
        return saved
    from ..perf_model.cost_curve import get_cost_curve, kernel_table_curve

    # generate() never measures (no hidden work): a cached curve, else the kernel table's measured at enable
    curve = get_cost_curve(target, measure_if_missing=False) or kernel_table_curve(target)
    if curve is None:
        logger.warning_once(
            "no measured cost curve for this model: calibrated drafters keep their saved trees; measure this machine's "
            "once with `hf-speculative calibrate --model M` or `hf_speculative.perf_model.get_cost_curve(model)`"
        )
        return saved
    cost = _per_batch(
        draft_cost(curve) if callable(draft_cost) else draft_cost, batch_size * curve(1) / curve(batch_size)
    )
    accuracies = accuracies[:max_depth] if max_depth is not None else accuracies
    max_nodes = max_nodes or max(curve.max_nodes // batch_size - 1, 1)
    if candidates is None:
        tree = TreeSpec.optimize(accuracies, max_nodes, cost=curve, draft_cost=cost, batch_size=batch_size)
    else:  # the best candidate; ties go to the smaller tree
        trees = sorted(candidates(len(accuracies), max_nodes), key=lambda t: (t.num_nodes, t.depth))
        if not trees:
            return saved
        tree = max(trees, key=lambda t: t.expected_speedup(accuracies, curve, cost, batch_size=batch_size))
    speedup = tree.expected_speedup(accuracies, curve, cost, batch_size=batch_size)
    message = (
        f"cost-aware default tree (batch {batch_size}): {tree.num_nodes} nodes, depth {tree.depth}, "
        f"expected tau / step cost {speedup:.2f}"
    )
    if speedup < 1:  # once per message, not once per generate() call
        logger.warning_once(f"{message}: no tree pays for itself with these accuracies on this machine")
    else:
        logger.info(message)
    return tree


def _per_batch(draft_cost, scale: float):
    """A drafting cost (number, per-depth list or ``f(num_nodes, depth)``) times ``scale``."""
    if scale == 1:
        return draft_cost
    if callable(draft_cost):
        return lambda n, d: scale * float(draft_cost(n, d))
    if isinstance(draft_cost, (int, float)):
        return scale * float(draft_cost)
    return [scale * float(c) for c in draft_cost]
