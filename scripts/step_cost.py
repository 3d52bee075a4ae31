"""Cost of one verification forward over n tree tokens, in plain decoding steps, on the reference model.

    python scripts/step_cost.py --threads 1 --nodes 8,16,29,40

Measures the cost curve c(n) with `hf_speculative.perf_model.measure_cost_curve` (best of ``--repeats``
forwards over n new tokens after a cached prefix, divided by a one-token step), with logits for one row
(a lazily applied LM head) and for all n rows (what the tree engine computes), and the cost of projecting
a few drafter rows onto the vocabulary. A tree of n nodes pays off when tau exceeds c(n + 1) plus the
drafting cost; `TreeSpec.optimize(accuracies, num_nodes, cost=curve)` picks the tree that pays most.
"""

from __future__ import annotations

import argparse

import torch

from hf_speculative.bench import load_reference_model
from hf_speculative.perf_model import measure_cost_curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prefix", type=int, default=128)
    parser.add_argument("--nodes", default="8,16,29,40")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_reference_model()
    nodes = [int(x) for x in args.nodes.split(",")]
    one_row = measure_cost_curve(model, nodes, args.prefix, args.repeats, projection_rows=(), logits_to_keep=1)
    all_rows = measure_cost_curve(model, nodes, args.prefix, args.repeats, projection_rows=(1, 2, 3, 4, 5))
    step_ms = 1000 * all_rows.meta["step_seconds"]
    print(f"one decoding step: {step_ms:.1f} ms ({torch.get_num_threads()} threads, prefix {args.prefix})")
    print("| new tokens | LM head on 1 row | LM head on all rows |\n|---:|---:|---:|")
    for n in nodes:
        print(f"| {n} | {one_row(n):.2f}x | {all_rows(n):.2f}x |")
    print("\n| drafter rows through the LM head | cost in plain steps |\n|---:|---:|")
    for rows, ratio in zip(all_rows.projection_rows, all_rows.projection_ratios):
        print(f"| {rows} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
