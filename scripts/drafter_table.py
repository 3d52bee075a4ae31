"""Several trained drafter folders against plain greedy decoding on the same prompts, in one process: the
ablation tables of the ParallelSpec drafter (k) and of Speculative Streaming (gamma, N_s, tree pruning).

    python scripts/drafter_table.py outputs/parallel_k2 outputs/parallel_k3 ... --out outputs/parallel_k_table.json
    python scripts/drafter_table.py outputs/streaming_pruned_l20 --pruning-thresholds 0,0.01,0.05

Each folder loads with ``AutoModel.from_pretrained`` (any hf_speculative drafter) and drafts for the one
reference model with its own tree. Prompts: the first ``--per-category`` MT-Bench first turns of every
category, chat template, greedy, 128 new tokens. Per prompt, plain ``generate`` runs first and then every
drafter (so machine load affects all alike). Reports tau (tokens per target forward, prefill included, as
the bench harness), tokens/s, speedup over plain, the mean verified tree size and whether every output
equals plain greedy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModel

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model
from hf_speculative.bench.prompts import first_per_category, load_prompts
from hf_speculative.training.data import encode_chat

DESCRIBE = ("num_mask_tokens", "num_heads", "num_streams", "num_msa_layers", "pruning_layer")


def add_prompt_arguments(p: argparse.ArgumentParser) -> None:
    """The prompt / decoding / output arguments of this script and `tau_curve.py`."""
    p.add_argument("--prompts", default="mt_bench", help="built-in prompt set or prompt file (default mt_bench)")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)


def reference_and_prompts(args) -> tuple[object, list[torch.Tensor]]:
    """The enabled reference model and the chat-templated prompts (first ``per_category`` of each category)."""
    torch.set_num_threads(args.threads)
    model, tokenizer = load_reference_model()
    hfs.enable(model)
    records = first_per_category(load_prompts(args.prompts), args.per_category)
    return model, [torch.tensor([encode_chat(tokenizer, r.messages)]) for r in records]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="drafter folders")
    p.add_argument(
        "--pruning-thresholds", default=None, help="comma list: one row per threshold for folders with a pruning head"
    )
    add_prompt_arguments(p)
    args = p.parse_args()
    model, prompts = reference_and_prompts(args)

    runs = []  # (label, drafter, pruning threshold or None)
    for folder in args.folders:
        drafter = AutoModel.from_pretrained(folder)
        thresholds = [None]
        if args.pruning_thresholds and getattr(drafter.config, "pruning_layer", None) is not None:
            thresholds = [float(t) for t in args.pruning_thresholds.split(",")]
        runs += [(folder, drafter, t) for t in thresholds]
    rows = [{"method": "plain", "seconds": 0.0, "tokens": 0, "forwards": 0, "nodes": [], "identical": 0}]
    rows += [
        {
            "method": label,
            "pruning_threshold": t,
            "seconds": 0.0,
            "tokens": 0,
            "forwards": 0,
            "nodes": [],
            "identical": 0,
            **{k: getattr(d.config, k) for k in DESCRIBE if getattr(d.config, k, None) is not None},
        }
        for label, d, t in runs
    ]
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    for i, ids in enumerate(prompts):
        start = time.perf_counter()
        ref = model.generate(ids, **kwargs)
        rows[0]["seconds"] += time.perf_counter() - start
        new = ref.shape[1] - ids.shape[1]
        rows[0].update(
            tokens=rows[0]["tokens"] + new, forwards=rows[0]["forwards"] + new, identical=rows[0]["identical"] + 1
        )
        for row, (_, drafter, threshold) in zip(rows[1:], runs):
            if threshold is not None:
                drafter.config.pruning_threshold = threshold
            start = time.perf_counter()
            out = model.generate(ids, assistant_model=drafter, return_dict_in_generate=True, **kwargs)
            row["seconds"] += time.perf_counter() - start
            stats = out.speculative_stats
            row["tokens"] += out.sequences.shape[1] - ids.shape[1]
            row["forwards"] += stats.num_target_forwards
            row["nodes"] += stats.tree_sizes
            row["identical"] += int(torch.equal(out.sequences, ref))
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)
    plain_rate = rows[0]["tokens"] / rows[0]["seconds"]
    for row in rows:
        nodes = row.pop("nodes")
        row.update(
            tau=round(row["tokens"] / row["forwards"], 3),
            tokens_per_s=round(row["tokens"] / row["seconds"], 2),
            speedup=round(row["tokens"] / row["seconds"] / plain_rate, 3),
            mean_tree_nodes=round(sum(nodes) / len(nodes), 2) if nodes else None,
            identical=f"{row['identical']}/{len(prompts)}",
            seconds=round(row["seconds"], 1),
        )
    print(
        "| method | settings | tau | tok/s | speedup | verified nodes | identical |\n|---|---|---:|---:|---:|---:|---|"
    )
    for row in rows:
        settings = ", ".join(f"{k}={row[k]}" for k in (*DESCRIBE, "pruning_threshold") if row.get(k) is not None)
        print(
            f"| {row['method']} | {settings} | {row['tau']} | {row['tokens_per_s']} | {row['speedup']}x | {row['mean_tree_nodes']} | {row['identical']} |"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps({"threads": args.threads, "prompts": len(prompts), "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
