"""Give a trained drafter folder an FR-Spec draft vocabulary after the fact, from target-labelled shards.

    python examples/set_draft_vocab.py model_cards/parallel-drafter-smollm2-135m-instruct OUT \\
        --labelled ~/.cache/hf_speculative/labelled/smollm2-sharegpt --size 16384

The draft vocabulary is the ``--size`` most frequent tokens the target itself chose (its greedy top-1 at the
answer positions of the shards). Drafting then projects onto that share of the ``lm_head``; verification keeps
the full vocabulary, so the output does not change. Works for every drafter with ``set_draft_vocab`` (Medusa
heads, ParallelDrafter, Speculative Streaming).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("out")
    parser.add_argument("--labelled", action="append", required=True)
    parser.add_argument("--size", type=int, default=16384)
    args = parser.parse_args()
    from safetensors import safe_open

    from hf_speculative.bench import load_reference_model
    from hf_speculative.bench.harness import load_drafter
    from hf_speculative.drafters.draft_vocab import frequent_tokens
    from hf_speculative.training.labelling import LabelledShards

    model, _ = load_reference_model()
    drafter = load_drafter(args.folder, target=model)
    chosen = []
    for folder in args.labelled:
        for path, _ in LabelledShards(folder).shards:
            with safe_open(str(path), framework="pt") as f:
                labels, top1 = f.get_tensor("labels"), f.get_tensor("topk_ids")[:, 0]
            chosen.append(top1[labels != -100].long())
    ids = frequent_tokens(torch.cat(chosen), args.size, vocab_size=drafter.config.vocab_size)
    drafter.set_draft_vocab(ids)
    out = Path(args.out)
    drafter.save_pretrained(out)
    for extra in ("README.md", "generation_config.json"):
        if (Path(args.folder) / extra).is_file() and not (out / extra).is_file():
            shutil.copy(Path(args.folder) / extra, out / extra)
    print(
        json.dumps(
            {
                "folder": str(out),
                "draft_vocab_size": drafter.config.draft_vocab_size,
                "answer_tokens_counted": int(sum(c.numel() for c in chosen)),
            }
        )
    )


if __name__ == "__main__":
    main()
