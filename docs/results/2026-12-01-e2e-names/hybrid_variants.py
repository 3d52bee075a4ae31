"""LoRA + SuffixDecoding against EAGLE-3 + SuffixDecoding and variants of the hybrid, in one process, the order
rotating per prompt (every output compared with SuffixDecoding's, which equals plain decoding's).

    # the gate and the merged tree priced with EAGLE's drafting cost scaled by 0.4, and the ungated hybrid
    python docs/results/2026-12-01-e2e-names/hybrid_variants.py --cost-scale 0.4 --ungated --limit 30
    # EAGLE drafting after the free plan's likeliest path (apply follow.patch.gz first), cut below 0.5 and 0.8
    gunzip -c docs/results/2026-12-01-e2e-names/follow.patch.gz | git apply
    python docs/results/2026-12-01-e2e-names/hybrid_variants.py --follow-min 0 0.5 0.8 --limit 30

Run from the repository root; ``--data`` defaults to the task data at ``../shared/data/TASK``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "scripts"))

import downstream_steps  # noqa: E402
from downstream.compare import _load_arms, parse_arm  # noqa: E402

from hf_speculative.engine.trees import TreeSpec  # noqa: E402


def prompt_args(p: argparse.ArgumentParser, limit: int) -> argparse.Namespace:
    """Parse ``p`` with the test-prompt options (``--task``, ``--data``, ``--first``, ``--limit``, ``--threads``) and
    set the threads; ``--data`` defaults to the task data at ``../shared/data/TASK`` beside the repository."""
    p.add_argument("--task", default="e2e_nlg")
    p.add_argument("--data", default=None, help="the task's data folder")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--limit", type=int, default=limit)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    args.data = args.data or str(ROOT.parent / "shared" / "data" / args.task)
    torch.set_num_threads(args.threads)
    return args


def hybrid_of(arm):
    """The `HybridDrafter` an arm passes as ``assistant_model``."""
    cells = (c.cell_contents for c in arm.speculative.__closure__)
    return next(c["assistant_model"] for c in cells if isinstance(c, dict) and "assistant_model" in c)


def alternate(names: list[str], arms, prompts: list[torch.Tensor], n_new: int) -> None:
    """Decode every prompt with every arm, the arms' order rotating per prompt, and print each arm's tau, time,
    speed against the first arm's and how many outputs match the first arm's."""
    for arm in arms:
        arm.speculative(prompts[0], 8)  # warm-up
    seconds, accepted, outs = [0.0] * len(arms), [[] for _ in arms], [[] for _ in arms]
    for i, ids in enumerate(prompts):
        for k in [(i + j) % len(arms) for j in range(len(arms))]:
            start = time.perf_counter()
            out = arms[k].speculative(ids, n_new)
            seconds[k] += time.perf_counter() - start
            accepted[k] += list(out.speculative_stats.accepted_lengths)
            outs[k].append(out.sequences[0, ids.shape[1] :].tolist())
    for name, s, acc, out in zip(names, seconds, accepted, outs):
        same = sum(x == y for x, y in zip(out, outs[0]))
        print(
            f"{name:28s} tau {sum(acc) / len(acc):.2f}  {s:6.2f} s  {seconds[0] / s:.3f}x {names[0]}'s speed  "
            f"same {same}/{len(out)}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lora", default="model_cards/lora-smollm2-135m-e2e-nlg")
    p.add_argument("--eagle", default="model_cards/eagle3-smollm2-135m-e2e-nlg")
    p.add_argument("--cost-scale", type=float, nargs="*", default=[])
    p.add_argument("--follow-min", type=float, nargs="*", default=[])
    p.add_argument("--ungated", action="store_true")
    p.add_argument(
        "--eagle-tree", action="append", default=[], help="EAGLE-3's own tree in the hybrid, as JSON paths of ranks"
    )
    args = prompt_args(p, limit=30)
    names = ["LoRA + SuffixDecoding", "EAGLE-3 + SuffixDecoding"]
    names += [f"drafting cost x{s}" for s in args.cost_scale] + [f"follow, scores >= {m}" for m in args.follow_min]
    names += [f"EAGLE-3 tree {t}" for t in args.eagle_tree]
    n_variants = len(args.cost_scale) + len(args.follow_min) + len(args.eagle_tree)
    specs = [f"{args.lora}:suffix"] + [f"{args.eagle}:hybrid-suffix"] * (1 + n_variants)
    if args.ungated:
        names, specs = names + ["ungated"], specs + [f"{args.eagle}:hybrid-suffix-ungated"]
    with torch.inference_mode():
        arms = _load_arms([parse_arm(s) for s in specs], args.task, args.data, None, None)
        variants = arms[2 : 2 + n_variants]
        for s, arm in zip(args.cost_scale, variants):
            hybrid = hybrid_of(arm)
            hybrid._part_costs = lambda h=hybrid, s=s: [c * s for c in type(h)._part_costs(h)]
        for m, arm in zip(args.follow_min, variants[len(args.cost_scale) :]):
            if not hasattr(hybrid_of(arm), "follow"):
                raise SystemExit("--follow-min needs follow.patch.gz applied (gunzip -c ... | git apply)")
            hybrid_of(arm).follow, hybrid_of(arm).follow_min = True, m
        for paths, arm in zip(args.eagle_tree, variants[len(args.cost_scale) + len(args.follow_min) :]):
            hybrid, spec = hybrid_of(arm), TreeSpec.from_choices(json.loads(paths))
            hybrid._part_trees_for = lambda b, h=hybrid, spec=spec: [spec] + type(h)._part_trees_for(h, b)[1:]
        prompts = downstream_steps._prompts(args, arms[0].tokenizer)
        alternate(names, arms, prompts, 64)


if __name__ == "__main__":
    main()
