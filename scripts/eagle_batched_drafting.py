"""An EAGLE folder at batch 4: its static trees drafted for every row at once against row by row, beside plain
``generate()`` and the engine with nothing drafted, in one run (the order rotating per batch), greedy.

Run from a checkout root with the task data beside it::

    python scripts/eagle_batched_drafting.py [--folder model_cards/eagle3-smollm2-135m-e2e-nlg] [--task e2e_nlg]
        [--batches 4] [--batch-size 4] [--max-new-tokens 64] [--threads 2] [--output FILE.json]

The folder's LoRA model (merged) is the target; prompts are the task's test split after the first batch (a warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
# noqa below: these imports must follow the sys.path lines (this checkout's package and its benchmarks)
from downstream.evaluation import load_downstream  # noqa: E402
from downstream.tasks import load_task  # noqa: E402

import hf_speculative as hfs  # noqa: E402
from hf_speculative.bench.harness import machine_info  # noqa: E402
from hf_speculative.drafters.eagle.modeling_eagle import EagleDrafter, EagleTreeDrafter  # noqa: E402
from hf_speculative.training.data import encode_chat  # noqa: E402

KINDS = ("plain", "engine", "row by row", "batched")


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r) :] = torch.tensor(r)
        mask[b, width - len(r) :] = 1
    return ids, mask


def row_by_row(self, sequences, rows, tree, options):
    """`EagleTreeDrafter.propose_batch` without its batched path: every row drafts alone (`OneRowDrafter`)."""
    return super(EagleTreeDrafter, self).propose_batch(sequences, rows, tree, options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="model_cards/eagle3-smollm2-135m-e2e-nlg")
    parser.add_argument("--task", default="e2e_nlg")
    parser.add_argument("--data", default=None, help="task data folder (default ../shared/data/TASK)")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    arm = load_downstream(args.folder)
    tok, model = arm.tokenizer, arm.model
    eagle = EagleDrafter.from_pretrained(args.folder, base_model=model).to(device=model.device, dtype=model.dtype)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    records = load_task(args.task, args.data or f"../shared/data/{args.task}", "test")
    encoded = [encode_chat(tok, r.messages) for r in records[: (args.batches + 1) * args.batch_size]]
    batches = [left_padded(encoded[i : i + args.batch_size], pad) for i in range(0, len(encoded), args.batch_size)]
    nothing = hfs.PromptLookupDrafter(max_ngram_size=99, min_ngram_size=99)  # finds no match: one-token steps
    batched = EagleTreeDrafter.propose_batch

    def run(kind, ids, mask):
        kw = dict(attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)
        if kind == "plain":
            return model.generate(ids, **kw)
        if kind == "engine":
            return model.generate(ids, assistant_model=nothing, **kw)
        EagleTreeDrafter.propose_batch = batched if kind == "batched" else row_by_row
        return model.generate(ids, assistant_model=eagle, **kw)

    for kind in KINDS:  # warm-up
        run(kind, *batches[0])
    totals = {kind: {"seconds": 0.0, "tokens": 0, "identical": 0} for kind in KINDS}
    for i, (ids, mask) in enumerate(batches[1:]):
        outs = {}
        for kind in KINDS[i % len(KINDS) :] + KINDS[: i % len(KINDS)]:
            start = time.perf_counter()
            outs[kind] = run(kind, ids, mask)
            totals[kind]["seconds"] += time.perf_counter() - start
            totals[kind]["tokens"] += int((outs[kind][:, ids.shape[1] :] != pad).sum())
        for kind in KINDS:
            totals[kind]["identical"] += int(torch.equal(outs[kind], outs["plain"]))
    plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    print(f"| batch {args.batch_size} | tokens/s | over plain | batches identical to plain |\n|---|---:|---:|---:|")
    for kind, row in totals.items():
        row["tokens_per_s"] = round(row["tokens"] / row["seconds"], 2)
        row["speedup"] = round(row["tokens_per_s"] / plain, 3)
        print(f"| {kind} | {row['tokens_per_s']} | {row['speedup']:.2f}x | {row['identical']}/{len(batches) - 1} |")
    info = machine_info(model.device)
    flags = info.get("cpu_flags")
    flags = ", ".join(name for name, present in flags.items() if present) if isinstance(flags, dict) else flags
    print(f"measured on: {info.get('cpu')} ({flags}), {args.threads} threads")
    if args.output:
        record = {"folder": args.folder, "task": args.task, "batch_size": args.batch_size, "rows": totals}
        Path(args.output).write_text(json.dumps({**record, "machine": info}, indent=1))


if __name__ == "__main__":
    main()
