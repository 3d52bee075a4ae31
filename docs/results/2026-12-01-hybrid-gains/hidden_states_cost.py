"""What reading the target's hidden states costs a step: LoRA + SuffixDecoding twice in one process, the second arm's
drafter asking for the target's hidden states as EAGLE does (``needs_target_hidden_states``), the order alternating
per prompt.

    python docs/results/2026-12-01-hybrid-gains/hidden_states_cost.py --data ../shared/data/e2e_nlg --limit 30
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from downstream.compare import _load_arms, parse_arm  # noqa: E402
from downstream.tasks import get_task  # noqa: E402

from hf_speculative.engine.protocol import TreeDrafter  # noqa: E402
from hf_speculative.training.data import encode_chat  # noqa: E402


def drafter_of(arm) -> TreeDrafter:
    """The drafter an arm's ``speculative`` passes as ``assistant_model``."""
    for cell in arm.speculative.__closure__ or ():
        value = cell.cell_contents
        value = value.get("assistant_model") if isinstance(value, dict) else value
        if isinstance(value, TreeDrafter):
            return value
    raise ValueError("no drafter in this arm")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", default="model_cards/lora-smollm2-135m-e2e-nlg")
    p.add_argument("--task", default="e2e_nlg")
    p.add_argument("--data", required=True)
    p.add_argument("--limit", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(2)
    arms = _load_arms([parse_arm(f"{args.folder}:suffix")] * 2, args.task, args.data, None, None)
    drafter_of(arms[1]).needs_target_hidden_states = True
    task = get_task(args.task)
    prompts = [
        torch.tensor([encode_chat(arms[0].tokenizer, r.messages)]) for r in task.load(args.data, "test")[: args.limit]
    ]
    for arm in arms:
        arm.speculative(prompts[0], 8)  # warm-up
    timings, seconds, steps, tokens = [collections.Counter(), collections.Counter()], [0.0, 0.0], [0, 0], [0, 0]
    for i, ids in enumerate(prompts):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            start = time.perf_counter()
            stats = arms[k].speculative(ids, task.max_new_tokens).speculative_stats
            seconds[k] += time.perf_counter() - start
            timings[k].update(stats.timings)
            steps[k] += len(stats.accepted_lengths)
            tokens[k] += sum(stats.accepted_lengths)
    for k, name in enumerate(("SuffixDecoding", "SuffixDecoding, the target's hidden states read")):
        split = ", ".join(f"{key} {1000 * v / steps[k]:.1f}" for key, v in sorted(timings[k].items()))
        print(
            f"{name}: tau {tokens[k] / steps[k]:.2f}, {seconds[k]:.2f} s, {1000 * seconds[k] / steps[k]:.1f} ms/step ({split})"
        )


if __name__ == "__main__":
    main()
