"""tau against training data for the ParallelSpec drafter: greedy generation with each checkpoint of a run
(``hf-speculative train parallel-drafter --curve-points N --curve-checkpoints DIR``), all with one tree, or with
the drafters of the k ablation (``--drafters outputs/parallel_k2 outputs/parallel_k3 ...``, each its own tree).

    python examples/parallel_tau_curve.py --checkpoints outputs/parallel_curve \\
        --tree-from model_cards/parallel-drafter-smollm2-135m-instruct --out outputs/parallel_tau_curve.json

Prompts: the first ``--per-category`` MT-Bench first turns of every category (tau only, no timing).
"""

import argparse
import json
import re
from pathlib import Path

import torch
from transformers import AutoModel

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model
from hf_speculative.training.data import encode_chat, load_questions


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoints", default=None, help="folder of step* checkpoints")
    p.add_argument("--tree-from", default=None, help="drafter folder whose tree (parallel_choices) every checkpoint uses")
    p.add_argument("--drafters", nargs="*", default=[], help="drafter folders, each with its own tree")
    p.add_argument("--prompts", default="/work/shared/data/mt_bench/question.jsonl")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_reference_model()
    hfs.enable(model)
    seen: dict = {}
    records = [r for r in load_questions(args.prompts) if seen.setdefault(r.category, []).append(r) or len(seen[r.category]) <= args.per_category]
    prompts = [torch.tensor([encode_chat(tokenizer, r.messages)]) for r in records]
    runs = []
    if args.checkpoints:
        tree = AutoModel.from_pretrained(args.tree_from).config.tree
        training = json.loads((Path(args.tree_from) / "config.json").read_text()).get("training") or {}
        points = {pt["step"]: pt for pt in (training.get("learning_curve") or [])}
        for ckpt in sorted(Path(args.checkpoints).glob("step*"), key=lambda d: int(re.sub(r"\D", "", d.name))):
            step = int(re.sub(r"\D", "", ckpt.name))
            runs.append((ckpt, tree, {"step": step, "train_groups": points.get(step, {}).get("train_groups"),
                                      "expected_tau": points.get(step, {}).get("expected_tau_calibrated")}))  # fmt: skip
    for folder in args.drafters:
        cfg = json.loads((Path(folder) / "config.json").read_text())
        runs.append((Path(folder), None, {"drafter": folder, "k": cfg["num_mask_tokens"],
                                          "expected_tau": (cfg.get("calibration") or {}).get("expected_acceptance_length")}))  # fmt: skip
    rows = []
    for folder, tree, row in runs:
        drafter = AutoModel.from_pretrained(folder)
        lengths, draft_s, target_s = [], 0.0, 0.0
        for ids in prompts:
            out = model.generate(ids, assistant_model=drafter, speculative_tree=tree, max_new_tokens=args.max_new_tokens,
                                 do_sample=False, return_dict_in_generate=True)  # fmt: skip
            lengths += out.speculative_stats.accepted_lengths  # prefill included, as in the bench harness
            draft_s += out.speculative_stats.timings["draft"]
            target_s += out.speculative_stats.timings["target"]
        row.update(tau=round(sum(lengths) / len(lengths), 3), prompts=len(prompts), draft_over_target_time=round(draft_s / target_s, 4))
        rows.append(row)
        print(row, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
