"""A downstream EAGLE folder's draft trees side by side on the task's *calibration* prompts (held out from training,
never the test prompts): tok/s against plain decoding of the same model, tau, verified nodes per step and the
split of the speculative time into drafting, target forwards and the engine's own work. Plain and each tree
alternate per prompt; one warm-up prompt first.

    python scripts/eagle_trees.py outputs/train/eagle3-e2e-self --data ../shared/data/e2e_nlg --limit 8 \
        --trees default,dynamic,chain3,chain5 --threads 2 --output out.json

``default`` is the folder's own tree (the cost-aware one when calibrated), ``dynamic`` EAGLE-2's tree of its config,
``chainN`` a chain of N, ``cartesian:4,2,1`` a full tree with that many children per depth; a name ending in
``+torch-drafting`` drafts that tree with the drafter's linear layers on torch's own kernels instead of the engine's,
one ending in ``+no-context`` without the prompt's tokens in the draft vocabulary (``EagleConfig.context_tokens``).

``--prompts new-names`` (E2E NLG) draws prompts instead, from the training MRs' slots and values with a made-up
venue name in every name slot (seed 1; never a calibration or test MR): the unseen names test MRs bring.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _tree(name: str, drafter):
    import hf_speculative as hfs

    name = name.removesuffix("+torch-drafting").removesuffix("+no-context")
    if name == "default":
        return None
    if name == "dynamic":
        c = drafter.config
        return hfs.DynamicTree(total_tokens=c.total_tokens, depth=c.tree_depth, top_k=c.tree_top_k)
    if name.startswith("chain"):
        return hfs.TreeSpec.chain(int(name[5:]))
    if name.startswith("cartesian:"):
        return hfs.TreeSpec.cartesian([int(k) for k in name.split(":")[1].split(",")])
    raise SystemExit(f"unknown tree {name!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--data", required=True)
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--trees", default="default,dynamic,chain3")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", default=None)
    p.add_argument("--prompts", choices=("calibration", "new-names"), default="calibration")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from downstream.evaluation import _merged
    from downstream.self_distilled import unique_prompts
    from downstream.tasks import calibration_split, get_task
    from downstream.training import read_downstream_info

    import hf_speculative as hfs
    from hf_speculative.bench.harness import machine_info
    from hf_speculative.bench.reference import resolve_model
    from hf_speculative.drafters.eagle.modeling_eagle import EagleDrafter, EagleTreeDrafter
    from hf_speculative.training.data import encode_chat

    folder = Path(args.folder)
    info = read_downstream_info(folder)
    settings = info["training"]["settings"]
    spec = get_task(info["task"])
    train, calib = calibration_split(
        spec.load(args.data, "train"), settings["calibration_prompts"], seed=settings["seed"]
    )
    if args.prompts == "new-names":
        from downstream.self_distilled import synthetic_e2e_prompts

        held = {r.turns[0] for r in calib} | {r.turns[0] for r in spec.load(args.data, "test")}
        calib = synthetic_e2e_prompts(train, args.limit + 1, seed=1, exclude=held, new_names=1.0)
    base, tok = resolve_model(info["base_model"])
    model = _merged(base, folder, EagleDrafter.config_class.from_pretrained(folder).base_adapter)
    eagle = EagleDrafter.from_pretrained(folder, base_model=model).to(dtype=model.dtype).eval()
    hfs.enable(model)
    prompts = [torch.tensor([encode_chat(tok, r.messages)]) for r in unique_prompts(calib)[: args.limit + 1]]
    names = args.trees.split(",")
    trees = {n: _tree(n, eagle) for n in names}
    rows = {
        n: {
            "seconds": 0.0,
            "tokens": 0,
            "forwards": 0,
            "nodes": 0,
            "timings": dict.fromkeys(("draft", "target", "engine"), 0.0),
        }
        for n in ["plain", *names]
    }
    n_new = spec.max_new_tokens
    for i, ids in enumerate(prompts):
        order = ["plain", *names] if i % 2 else [*names, "plain"]
        for name in order:
            t0 = time.perf_counter()
            if name == "plain":
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False)
                seq, stats = out, None
            else:
                torch_drafting = name.endswith("+torch-drafting")
                if torch_drafting:  # the drafter's networks left to torch's kernels
                    EagleTreeDrafter.draft_modules = lambda self: ()
                eagle.config.context_tokens = not name.endswith("+no-context")
                res = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=n_new,
                    do_sample=False,
                    assistant_model=eagle,
                    speculative_tree=trees[name],
                    return_dict_in_generate=True,
                )
                if torch_drafting:
                    del EagleTreeDrafter.draft_modules
                seq, stats = res.sequences, res.speculative_stats
            dt = time.perf_counter() - t0
            if i == 0:
                continue  # warm-up
            r = rows[name]
            r["seconds"] += dt
            r["tokens"] += seq.shape[1] - ids.shape[1]
            if stats is not None:
                r["forwards"] += stats.num_target_forwards
                r["nodes"] += sum(stats.tree_sizes)
                for k in r["timings"]:
                    r["timings"][k] += stats.timings.get(k, 0.0)
    plain_tps = rows["plain"]["tokens"] / rows["plain"]["seconds"]
    print(
        f"{'tree':<14}{'tok/s':>8}{'x plain':>9}{'tau':>7}{'nodes/step':>12}{'draft s':>9}{'target s':>10}{'engine s':>10}"
    )
    for name, r in rows.items():
        tps = r["tokens"] / r["seconds"]
        r["tokens_per_s"], r["speedup"] = round(tps, 2), round(tps / plain_tps, 3)
        r["tau"] = round(r["tokens"] / r["forwards"], 3) if r["forwards"] else None
        r["nodes_per_step"] = round(r["nodes"] / r["forwards"], 2) if r["forwards"] else None
        t = r["timings"]
        print(
            f"{name:<14}{tps:>8.2f}{tps / plain_tps:>9.2f}{r['tau'] or 1:>7.2f}{r['nodes_per_step'] or 0:>12.2f}"
            f"{t['draft']:>9.2f}{t['target']:>10.2f}{t['engine']:>10.2f}"
        )
    default = eagle.get_tree_drafter(model).default_tree
    print(
        f"default tree: {default!r}" if not isinstance(default, hfs.TreeSpec) else f"default tree: {default.to_list()}"
    )
    result = {
        "folder": str(folder),
        "prompts": args.prompts,
        "n": len(prompts) - 1,
        "rows": rows,
        "default_tree": default.to_list() if isinstance(default, hfs.TreeSpec) else repr(default),
        "machine": machine_info(model.device),
        "command": " ".join(sys.argv),
    }
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
