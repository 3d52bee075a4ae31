"""What a hybrid's costly part (EAGLE-3, Medusa heads) adds beyond the free parts' plan, per row it drafts for, by
the free plan's expected tokens (``tau_free``): the measure `DraftGate` learns from.

    # the hybrid as it runs (the gate decides), then with the gate drafting for every row
    python docs/results/2026-12-01-hybrid-gains/gate_gains.py model_cards/eagle3-smollm2-135m-e2e-nlg:hybrid-suffix \
        --task e2e_nlg --data ../shared/data/e2e_nlg --first 100 --limit 60 [--always]

Per row: the gain (tokens accepted beyond the free plan's deepest accepted node, as `HybridDrafter` measures it), and
the gain had the part's chain stopped at depth 1..6 (its first-drafted tokens only).
"""

from __future__ import annotations

import argparse
import collections
import sys
from bisect import bisect_right
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from downstream.compare import _load_arms, parse_arm  # noqa: E402
from downstream.tasks import get_task  # noqa: E402

from hf_speculative.drafters import hybrid  # noqa: E402
from hf_speculative.drafters.draft_gate import accepted_depth  # noqa: E402
from hf_speculative.training.data import encode_chat  # noqa: E402

EDGES = (1.25, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)


def chain_depth(tokens: list[int], parents: list[int], committed: list[int], cut: int) -> int:
    """The deepest node of a part's own tree on the committed path (`accepted_depth`), its nodes deeper than ``cut``
    left out."""
    depth = [0] * len(tokens)
    for node in range(1, len(tokens)):
        depth[node] = depth[parents[node]] + 1
    return accepted_depth(tokens, parents, [n for n in range(len(tokens)) if depth[n] <= cut], committed)


def record(args) -> list[dict]:
    rows = []
    learn = hybrid.HybridDrafter._learn_gains

    def recording(self, r, committed):
        if r in self._free:
            tokens, parents, _, keep, tau_free, _ = self._free[r]
            free = accepted_depth(tokens, parents, keep, committed)
            for i, own in enumerate(self._own.get(r, ())):
                if self._gated[i] and own is not None:
                    et, ep = own.tokens.tolist(), list(own.parents)
                    cuts = [
                        max(0, min(len(committed) - 1, max(free, chain_depth(et, ep, committed, k))) - free)
                        for k in range(1, 7)
                    ]
                    rows.append({"tau_free": tau_free, "gain": len(committed) - 1 - free, "cuts": cuts})
        return learn(self, r, committed)

    hybrid.HybridDrafter._learn_gains = recording
    if args.always:
        hybrid.DraftGate.wants = lambda self, *a: True
    (arm,) = _load_arms([parse_arm(args.arm)], args.task, args.data, None, None)
    task = get_task(args.task)
    for r in task.load(args.data, "test")[args.first : args.first + args.limit]:
        arm.speculative(torch.tensor([encode_chat(arm.tokenizer, r.messages)]), task.max_new_tokens)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arm")
    p.add_argument("--task", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--first", type=int, default=100)
    p.add_argument("--limit", type=int, default=60)
    p.add_argument("--always", action="store_true", help="the gate lets the part draft for every row")
    args = p.parse_args()
    torch.set_num_threads(2)
    rows = record(args)
    bands = collections.defaultdict(list)
    for row in rows:
        bands[bisect_right(EDGES, row["tau_free"])].append(row)
    print(f"{len(rows)} rows the part drafted for")
    print("| tau_free | rows | gain | gain, chain cut at depth 1 / 2 / 3 / 4 / 5 / 6 |")
    print("|---|---:|---:|---|")
    for b in sorted(bands) + ["all"]:
        group = rows if b == "all" else bands[b]
        low = (
            "all" if b == "all" else f"{([0.0] + list(EDGES))[b]:.2f}-" + (f"{EDGES[b]:.2f}" if b < len(EDGES) else "")
        )
        cuts = " / ".join(f"{sum(r['cuts'][k] for r in group) / len(group):.2f}" for k in range(6))
        print(f"| {low} | {len(group)} | {sum(r['gain'] for r in group) / len(group):.2f} | {cuts} |")


if __name__ == "__main__":
    main()
