"""tau of drafter folders on the same MT-Bench prompts (greedy, each drafter's own calibrated tree).

    python scripts/tau_points.py model_cards/medusa-smollm2-135m-instruct OTHER_FOLDER ... [--prompts 6] [--threads 1]

Used for the tau-against-training-data points of docs/medusa.md and docs/training_data.md: the first prompt of
each of the first N MT-Bench categories, 96 new tokens each, one torch thread. Any drafter folder works (Medusa
heads, ParallelDrafter, Speculative Streaming, a causal LM); the tree is the one calibrated at training time
(cost-aware trees are switched off, so the number does not depend on this machine's cost curve). tau counts
tokens per target forward, so it does not depend on the machine's speed either.
"""

from __future__ import annotations

import argparse
import os

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["HF_SPECULATIVE_COST_AWARE"] = "0"  # each drafter's calibrated static tree
    import hf_speculative as hfs
    from hf_speculative.bench import load_reference_model
    from hf_speculative.bench.harness import load_drafter
    from hf_speculative.bench.prompts import first_per_category, load_prompts

    torch.set_num_threads(args.threads)
    model, tok = load_reference_model()
    hfs.enable(model)
    records = first_per_category(load_prompts("mt_bench"), 1)[: args.prompts]
    for folder in args.folders:
        drafter = load_drafter(folder, target=model)
        new = forwards = 0
        for r in records:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": r.prompt}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )["input_ids"]
            out = model.generate(
                ids,
                assistant_model=drafter,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                return_dict_in_generate=True,
            )
            new += out.speculative_stats.num_new_tokens
            forwards += out.speculative_stats.num_target_forwards
        sizes = out.speculative_stats.tree_sizes
        print(
            f"{folder}: tau {new / forwards:.3f} ({type(drafter).__name__}, {sizes[-1] if sizes else '?'}-node tree, {len(records)} prompts)",
            flush=True,
        )


if __name__ == "__main__":
    main()
