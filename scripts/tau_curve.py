"""tau against training data for any drafter: greedy generation with each checkpoint of a training run (Medusa
``--curve-checkpoints``, ParallelDrafter ``--curve-checkpoints``), all with one tree taken from the final folder,
next to the held-out expectation its learning curve recorded (the k ablation, each drafter with its own tree and
timings: ``scripts/drafter_table.py``).

    python scripts/tau_curve.py --checkpoints outputs/parallel_curve \
        --tree-from model_cards/parallel-drafter-smollm2-135m-instruct --out outputs/parallel_tau_curve.json
    python scripts/tau_curve.py --checkpoints outputs/medusa_curve --tree-from model_cards/medusa-smollm2-135m-instruct

Prompts: the first ``--per-category`` MT-Bench first turns of every category (tau only, no timing).
"""

import argparse
import json
import re
from pathlib import Path

from drafter_table import add_prompt_arguments, reference_and_prompts  # scripts/ is the script's folder
from transformers import AutoModel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoints", required=True, help="folder of step* checkpoints")
    p.add_argument(
        "--tree-from",
        required=True,
        help="drafter folder whose tree every checkpoint uses (and whose learning curve gives the expectations)",
    )
    add_prompt_arguments(p)
    args = p.parse_args()
    model, prompts = reference_and_prompts(args)
    runs = []
    tree = AutoModel.from_pretrained(args.tree_from).config.tree
    training = json.loads((Path(args.tree_from) / "config.json").read_text()).get("training") or {}
    points = {pt["step"]: pt for pt in (training.get("learning_curve") or [])}
    for ckpt in sorted(Path(args.checkpoints).glob("step*"), key=lambda d: int(re.sub(r"\D", "", d.name))):
        step = int(re.sub(r"\D", "", ckpt.name))
        point = points.get(step, {})  # training seen (train_groups / train_positions / ...) and the expectation
        runs.append(
            (
                ckpt,
                tree,
                {
                    "step": step,
                    **{k: v for k, v in point.items() if k.startswith("train_")},
                    "expected_tau": point.get("expected_tau_calibrated"),
                },
            )
        )
    rows = []
    for folder, tree, row in runs:
        drafter = AutoModel.from_pretrained(folder)
        lengths, draft_s, target_s = [], 0.0, 0.0
        for ids in prompts:
            out = model.generate(
                ids,
                assistant_model=drafter,
                speculative_tree=tree,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                return_dict_in_generate=True,
            )
            lengths += out.speculative_stats.accepted_lengths  # prefill included, as in the bench harness
            draft_s += out.speculative_stats.timings["draft"]
            target_s += out.speculative_stats.timings["target"]
        row.update(
            tau=round(sum(lengths) / len(lengths), 3),
            prompts=len(prompts),
            draft_over_target_time=round(draft_s / target_s, 4),
        )
        rows.append(row)
        print(row, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
