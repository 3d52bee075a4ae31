"""tau of Medusa heads folders on the same MT-Bench prompts (greedy, each folder's own calibrated tree).

    python examples/medusa_tau_points.py model_cards/medusa-smollm2-135m-instruct OTHER_FOLDER ... [--prompts 6] [--threads 1]

Used for the tau-against-training-data points of docs/medusa.md: the first prompt of each of the first N
MT-Bench categories, 96 new tokens each, one torch thread.
"""

from __future__ import annotations

import argparse

import torch

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model
from hf_speculative.bench.prompts import first_per_category, load_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_reference_model()
    hfs.enable(model)
    records = first_per_category(load_prompts("mt_bench"), 1)[: args.prompts]
    for folder in args.folders:
        heads = hfs.MedusaHeadsModel.from_pretrained(folder, base_model=model)
        choices = heads.config.calibration.get("medusa_choices") if heads.config.calibration else None
        tree = hfs.TreeSpec.from_choices(choices or heads.config.medusa_choices)
        new = forwards = 0
        for r in records:
            ids = tok.apply_chat_template([{"role": "user", "content": r.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
            out = model.generate(ids, assistant_model=heads, speculative_tree=tree, max_new_tokens=args.max_new_tokens, do_sample=False, return_dict_in_generate=True)
            new += out.speculative_stats.num_new_tokens
            forwards += out.speculative_stats.num_target_forwards
        print(f"{folder}: tau {new / forwards:.3f} ({tree.num_nodes}-node calibrated tree, {len(records)} prompts)")


if __name__ == "__main__":
    main()
