"""An EAGLE downstream folder inside a hybrid with SuffixDecoding: where EAGLE's drafting time goes, and the hybrid
with EAGLE's part tree cut to a smaller depth.

    python scripts/hybrid_eagle_depth.py --folder outputs/train/eagle3-e2e-self --task e2e_nlg \
        --data ../shared/data/e2e_nlg --limit 30 --depths 0,2,1 --timers 10

``--timers N``: first, N test prompts decoded by EAGLE alone with timers around its drafter's methods (ms per
decoding step). Then SuffixDecoding alone and one gated hybrid per depth in ``--depths`` (0: EAGLE's own calibrated
tree) decode every prompt, the order rotating per prompt, each on the same loaded model; tok/s, tau and how many rows
EAGLE drafted for and was gated out of. Run it on an idle machine: it times.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _timed(totals, counts, name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - t0
            counts[name] += 1

    return wrapper


def drafting_timers(arm, prompts, max_new_tokens) -> dict:
    """ms per decoding step spent in each of EAGLE's drafting methods (EAGLE alone)."""
    from hf_speculative.drafters.eagle import drafting
    from hf_speculative.drafters.eagle import modeling_eagle as me

    totals, counts = collections.defaultdict(float), collections.Counter()
    methods = [
        (me.EagleTreeDrafter, "propose"),
        (drafting, "committed_rows"),  # a static tree's (`propose_rows`)
        (me, "committed_rows"),  # a dynamic tree's
        (drafting.TreeRows, "run"),
        (me.EagleDrafter, "forward"),
        (me.EagleDrafter, "compute_logits"),
    ]
    saved = [(cls, name, getattr(cls, name)) for cls, name in methods]
    for cls, name, fn in saved:
        setattr(cls, name, _timed(totals, counts, name, fn))
    try:
        t0, steps = time.perf_counter(), 0
        for ids in prompts:
            steps += len(arm.speculative(ids, max_new_tokens).speculative_stats.accepted_lengths)
        total = time.perf_counter() - t0
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    return {
        "steps": steps,
        "ms_per_step": 1000 * total / steps,
        **{f"{k}_ms_per_step": 1000 * v / steps for k, v in totals.items()},
        **{f"{k}_calls": v for k, v in counts.items()},
    }


def cut_tree(tree_drafter, depth: int):
    """The drafter with its own tree cut to ``depth`` (0: unchanged)."""
    import hf_speculative as hfs

    if depth:
        tree = hfs.TreeSpec([p for p in tree_drafter.default_tree.paths if len(p) <= depth])
        tree_drafter.default_tree, tree_drafter.batch_tree = tree, lambda batch_size: tree
    return tree_drafter


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", required=True, help="an EAGLE folder of 'downstream train'")
    p.add_argument("--task", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--limit", type=int, default=30)
    p.add_argument("--depths", default="0,2,1")
    p.add_argument("--timers", type=int, default=10, help="prompts of the drafting timers (0: none)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import torch

    import hf_speculative as hfs
    from benchmarks.downstream.evaluation import _suffix_drafter, load_downstream, training_targets
    from benchmarks.downstream.tasks import get_task
    from hf_speculative.drafters.eagle.modeling_eagle import EagleDrafter
    from hf_speculative.training.data import encode_chat

    torch.set_num_threads(args.threads)
    spec = get_task(args.task)
    arm = load_downstream(args.folder, drafter="prompt-lookup")
    model, tok = arm.model, arm.tokenizer
    prompts = [torch.tensor([encode_chat(tok, r.messages)]) for r in spec.load(args.data, "test")[: args.limit]]
    arm.speculative(prompts[0], 8)
    if args.timers:
        for k, v in drafting_timers(arm, prompts[: args.timers], spec.max_new_tokens).items():
            print(f"{k:32s} {v:.2f}" if isinstance(v, float) else f"{k:32s} {v}")

    warm = training_targets(args.task, args.data)
    eagle = EagleDrafter.from_pretrained(args.folder, base_model=model).to(dtype=model.dtype).eval()
    arms = {"suffix": _suffix_drafter(warm, tok)}
    for depth in (int(d) for d in args.depths.split(",")):
        arms[f"hybrid, EAGLE depth {depth or 'own'}"] = hfs.HybridDrafter(
            [cut_tree(eagle.get_tree_drafter(model), depth), _suffix_drafter(warm, tok)]
        )
    names = list(arms)
    rows = {name: {"seconds": 0.0, "tokens": 0, "accepted": []} for name in names}
    gen = dict(max_new_tokens=spec.max_new_tokens, do_sample=False, return_dict_in_generate=True)
    for name in names:
        model.generate(prompts[0], max_new_tokens=8, assistant_model=arms[name], do_sample=False)  # warm-up
    for i, ids in enumerate(prompts):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=arms[name], **gen)
            rows[name]["seconds"] += time.perf_counter() - t0
            rows[name]["tokens"] += out.sequences.shape[1] - ids.shape[1]
            rows[name]["accepted"] += list(out.speculative_stats.accepted_lengths)
    print("| arm | tok/s | tau | EAGLE rows drafted / gated out |\n|---|---:|---:|---:|")
    for name in names:
        r, d = rows[name], arms[name]
        gate = f"{d.drafted[0]} / {d.skipped[0]}" if isinstance(d, hfs.HybridDrafter) else "-"
        tau = sum(r["accepted"]) / len(r["accepted"])
        print(f"| {name} | {r['tokens'] / r['seconds']:.1f} | {tau:.2f} | {gate} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
