"""tau against training tokens: greedy generation with each saved checkpoint of a Medusa training run
(``hf-speculative train medusa --curve-points N --curve-checkpoints DIR``), all with one tree.

    python examples/medusa_tau_curve.py --checkpoints outputs/medusa_curve --tree-from model_cards/medusa-smollm2-135m-instruct

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
    p.add_argument("--checkpoints", required=True)
    p.add_argument("--tree-from", required=True, help="heads folder whose tree (medusa_choices) every checkpoint uses")
    p.add_argument("--prompts", default="/work/shared/data/mt_bench/question.jsonl")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_reference_model()
    hfs.enable(model)
    seen: dict = {}
    records = [r for r in load_questions(args.prompts) if seen.setdefault(r.category, []).append(r) or len(seen[r.category]) <= args.per_category]
    prompts = [torch.tensor([encode_chat(tokenizer, r.messages)]) for r in records]
    tree = hfs.TreeSpec.from_choices(AutoModel.from_pretrained(args.tree_from).config.medusa_choices)
    training = json.loads((Path(args.tree_from) / "config.json").read_text()).get("training") or {}
    positions = {pt["step"]: pt for pt in (training.get("learning_curve") or [])}
    rows = []
    for ckpt in sorted(Path(args.checkpoints).glob("step*"), key=lambda d: int(re.sub(r"\D", "", d.name))):
        heads = AutoModel.from_pretrained(ckpt)
        lengths = []
        for ids in prompts:
            out = model.generate(ids, assistant_model=heads, speculative_tree=tree, max_new_tokens=args.max_new_tokens,
                                 do_sample=False, return_dict_in_generate=True)  # fmt: skip
            lengths += out.speculative_stats.accepted_lengths  # prefill included, as in the bench harness
        step = int(re.sub(r"\D", "", ckpt.name))
        row = {"step": step, "train_positions": positions.get(step, {}).get("train_positions"),
               "expected_tau": positions.get(step, {}).get("expected_tau_calibrated"),
               "tau": round(sum(lengths) / len(lengths), 3), "prompts": len(prompts)}  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
