"""Does a truncated draft vocabulary (FR-Spec) cut drafting time? Times on the reference model.

    python scripts/draft_vocab_cost.py --threads 1 --sizes 8192,16384

1. the vocabulary projection of 1-5 drafter rows (`vocab_logits`) on the full 49K-token LM head against
   `draft_vocab_logits` on K rows of it (scatter back to 49K included);
2. one `MedusaDrafter.propose` of the reference Medusa heads (``model_cards/``) with and without it;
3. with ``--data``, the share of held-out answer tokens inside the K most frequent tokens of the rest.

Best (median) of ``--repeats`` runs, all variants interleaved per round.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model
from hf_speculative.drafters.draft_vocab import draft_vocab_logits, frequent_tokens
from hf_speculative.engine.logits import vocab_logits
from hf_speculative.engine.rows import TargetRows
from hf_speculative.engine.trees import DraftingOptions


def interleaved(fns: dict, repeats: int) -> dict:
    times = {k: [] for k in fns}
    for round_ in range(repeats + 1):  # round 0 warms up
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            if round_:
                times[k].append(time.perf_counter() - start)
    return {k: f"{1000 * min(v):.2f} ({1000 * statistics.median(v):.2f})" for k, v in times.items()}


def coverage(path: str, tokenizer, sizes: list[int], vocab: int) -> None:
    records = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    random.Random(0).shuffle(records)
    answers = [
        tokenizer(m["content"], add_special_tokens=False)["input_ids"]
        for r in records
        for m in r["messages"]
        if m["role"] == "assistant"
    ]
    held = len(answers) // 10
    held_ids = torch.tensor([t for a in answers[:held] for t in a])
    for k in sizes:
        share = torch.isin(held_ids, frequent_tokens(answers[held:], k, vocab_size=vocab)).float().mean()
        print(
            f"K={k}: {100 * float(share):.1f}% of {held_ids.numel()} held-out answer tokens are in the draft vocabulary"
        )


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sizes", default="8192,16384")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--heads", default="model_cards/medusa-smollm2-135m-instruct")
    parser.add_argument("--data", default=None, help="chat jsonl for the coverage check")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_reference_model()
    weight = model.get_output_embeddings().weight.detach()
    vocab, hidden = weight.shape
    sizes = [int(s) for s in args.sizes.split(",")]
    g = torch.Generator().manual_seed(0)
    maps = {k: torch.randperm(vocab, generator=g)[:k].sort().values for k in sizes}  # timing depends on K only
    states = torch.randn(5, hidden, generator=g)
    print(f"{torch.get_num_threads()} threads; ms, best (median) of {args.repeats}\n")
    print("| rows | full | " + " | ".join(f"{k}" for k in sizes) + " |\n|---:|---:|" + "---:|" * len(sizes))
    for rows in range(1, 6):
        fns = {"full": lambda r=rows: vocab_logits(states[:r], weight)}
        fns |= {k: (lambda r=rows, d=d: draft_vocab_logits(states[:r], weight, d)) for k, d in maps.items()}
        t = interleaved(fns, args.repeats)
        print(f"| {rows} | " + " | ".join(t[k] for k in fns) + " |")

    hfs.enable(model)
    prompt = tokenizer("Tell me about the history of Rome.", return_tensors="pt").input_ids
    outputs = model(prompt, output_hidden_states=True)
    tree = hfs.TreeSpec.cartesian([4, 2, 2, 1])
    drafters = {}
    for k, d in {"full": None, **maps}.items():
        heads = hfs.MedusaHeadsModel.from_pretrained(args.heads, base_model=model)
        heads.set_draft_vocab(d)
        heads.config.cost_aware_tree = False
        drafters[k] = heads.get_tree_drafter(model)
        drafters[k].begin_batch([prompt], TargetRows(outputs))
    fns = {k: (lambda dr=dr: dr.propose_batch([prompt], [0], tree, DraftingOptions())) for k, dr in drafters.items()}
    t = interleaved(fns, args.repeats)
    print(
        "\nMedusaDrafter.propose_batch (one row), tree cartesian [4, 2, 2, 1]: "
        + ", ".join(f"{k}: {v} ms" for k, v in t.items())
    )
    if args.data:
        print()
        coverage(args.data, tokenizer, sizes, vocab)


if __name__ == "__main__":
    main()
