"""LoRA + SuffixDecoding against the EAGLE-3 + SuffixDecoding hybrid as it is and as it was, in one process, the
order rotating per prompt (every output compared with SuffixDecoding's, which equals plain decoding's):

- ``as it is``: a row only SuffixDecoding drafted for is verified with SuffixDecoding's own tree
  (`TreeDrafter.prices_own_draft`), and the gate prices the merged tree's extra verification (`DraftGate`);
- ``merged free plan``: that row's tree re-priced by the hybrid (its calibrated scores), as before;
- ``gate without verification``: the gate weighing EAGLE's gain against its drafting time alone, as before;
- ``as it was``: both.

    python docs/results/2026-12-01-hybrid-own-tree/ab.py --limit 30 --spread \
        --warm-answers outputs/train/eagle3-e2e-wide/self_distilled.jsonl
    # the two ends only (as it is, as it was), the order rotating over three arms
    python docs/results/2026-12-01-hybrid-own-tree/ab.py --limit 30 --only

Run from the repository root; ``--data`` defaults to the task data at ``../shared/data/TASK``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(HERE.parent / "2026-12-01-e2e-names"))

from downstream.compare import _load_arms, parse_arm, sample_test_records  # noqa: E402
from downstream.tasks import get_task  # noqa: E402
from hybrid_variants import alternate, hybrid_of, prompt_args  # noqa: E402

from hf_speculative.training.data import encode_chat  # noqa: E402


def merged_free_plan(hybrid) -> None:
    """The hybrid re-prices every row's tree, SuffixDecoding's alone included (before `prices_own_draft`)."""
    begin = type(hybrid).begin_batch

    def begin_batch(prompts, target_outputs):
        begin(hybrid, prompts, target_outputs)
        hybrid._prices_own = [False] * len(hybrid.drafters)

    hybrid.begin_batch = begin_batch


def gate_without_verification(hybrid) -> None:
    """The gate weighs the gain against the drafting time alone (before the extra verification was measured)."""
    for gate in hybrid.gates:
        gate.extra_cost = lambda tau_free: 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lora", default="model_cards/lora-smollm2-135m-e2e-nlg")
    p.add_argument("--eagle", default="model_cards/eagle3-smollm2-135m-e2e-nlg")
    p.add_argument("--spread", action="store_true", help="--limit prompts evenly spaced over the test set")
    p.add_argument("--warm-answers", default=None, help="warm every SuffixDecoding with these answers (JSONL)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's")
    p.add_argument("--only", action="store_true", help="the hybrid as it is and as it was, not the two halves")
    args = prompt_args(p, limit=30)
    names = ["LoRA + SuffixDecoding", "hybrid as it is", "merged free plan", "gate without verification", "as it was"]
    specs = [f"{args.lora}:suffix"] + [f"{args.eagle}:hybrid-suffix"] * 4
    task = get_task(args.task)
    n_new = args.max_new_tokens or task.max_new_tokens
    with torch.inference_mode():
        arms = _load_arms([parse_arm(s) for s in specs], args.task, args.data, None, args.warm_answers)
        merged_free_plan(hybrid_of(arms[2]))
        gate_without_verification(hybrid_of(arms[3]))
        merged_free_plan(hybrid_of(arms[4]))
        gate_without_verification(hybrid_of(arms[4]))
        if args.only:
            names, arms = [names[0], names[1], names[4]], [arms[0], arms[1], arms[4]]
        records = sample_test_records(task.load(args.data, "test"), args.limit, args.spread, args.first)
        prompts = [torch.tensor([encode_chat(arms[0].tokenizer, r.messages)]) for r in records]
        print(
            f"{len(prompts)} prompts, {n_new} new tokens at most; "
            f"SuffixDecoding warmed with {args.warm_answers or 'references'}"
        )
        alternate(names, arms, prompts, n_new)


if __name__ == "__main__":
    main()
