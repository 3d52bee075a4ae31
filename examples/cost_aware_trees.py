"""The saved and the cost-aware default tree of each committed drafter, on this machine's cost curve.

    python examples/cost_aware_trees.py --threads 1                 # measures the curve once (about 10 s), cached
    python examples/cost_aware_trees.py --curve my_curve.json       # or a saved `CostCurve`

For Medusa, ParallelDrafter and Speculative Streaming (``model_cards/``) prints the expected tau (from the
calibration stored in the config), the step cost c(N + 1) + drafting in plain steps, and their ratio
(`TreeSpec.expected_speedup`) for the saved tree and for the tree the drafter now uses by default.
"""

from __future__ import annotations

import argparse
import os

import torch

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model
from hf_speculative.perf_model import CostCurve, get_cost_curve, set_cost_curve

CARDS = "model_cards"


def row(name: str, drafter, accuracies, saved: hfs.TreeSpec, curve: CostCurve) -> None:
    cost = drafter.draft_cost(curve)
    for label, tree in (("saved", saved), ("cost-aware", drafter.default_tree)):
        speed = tree.expected_speedup(accuracies, curve, cost)
        tau = tree.expected_acceptance_length(accuracies)
        print(f"| {name} | {label} | {tree.num_nodes} | {tree.depth} | {tau:.2f} | {tau / speed:.2f} | {speed:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--curve", default=None, help="a saved CostCurve JSON (default: measured once and cached)")
    parser.add_argument(
        "--draft-vocab", type=int, default=None, help="also score Medusa with a K-token draft vocabulary"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["HF_SPECULATIVE_COST_AWARE"] = "1"
    model, _ = load_reference_model()
    hfs.enable(model)
    curve = CostCurve.load(args.curve) if args.curve else get_cost_curve(model)
    set_cost_curve(model, curve)
    print(f"{curve} ({curve.meta.get('machine', '?')})\n")
    print(
        "| drafter | tree | nodes | depth | E[tau] | cost (steps) | E[tau] / cost |\n|---|---|---:|---:|---:|---:|---:|"
    )
    heads = hfs.MedusaHeadsModel.from_pretrained(f"{CARDS}/medusa-smollm2-135m-instruct", base_model=model)
    accuracies = heads.config.calibration["head_top_i_accuracy"]
    row("Medusa-1", heads.get_tree_drafter(model), accuracies, heads.config.tree, curve)
    if args.draft_vocab:
        heads.config.draft_vocab_size = args.draft_vocab  # the cost only depends on the size
        row(
            f"Medusa-1, {args.draft_vocab} draft tokens",
            heads.get_tree_drafter(model),
            accuracies,
            heads.config.tree,
            curve,
        )
    parallel = hfs.ParallelDrafter.from_pretrained(f"{CARDS}/parallel-drafter-smollm2-135m-instruct", base_model=model)
    row(
        "ParallelDrafter",
        parallel.get_tree_drafter(model),
        parallel.config.calibration["depth_top_i_accuracy"],
        parallel.config.tree,
        curve,
    )
    ss = hfs.LlamaForSpeculativeStreaming.from_pretrained(
        f"{CARDS}/speculative-streaming-smollm2-135m-instruct", base_model=model
    )
    set_cost_curve(ss, curve)  # it verifies with its own forward
    row(
        "Speculative Streaming",
        ss.get_self_drafter(),
        ss.config.calibration["stream_top_i_accuracy"],
        ss.config.tree,
        curve,
    )


if __name__ == "__main__":
    main()
