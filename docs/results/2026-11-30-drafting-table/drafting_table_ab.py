"""One downstream arm twice in one process: its drafter on the model's kernel table, and on its own (measured).

    python docs/results/2026-11-30-drafting-table/drafting_table_ab.py \
        model_cards/eagle3-smollm2-135m-e2e-nlg:hybrid-suffix e2e_nlg --first 0 --limit 30

The first copy's drafter network runs what drafting ran before `SpeedPolicy.drafting_table`: the model's table's
one-row kernel at every row count (torch's own where that is torch's). The second runs its own table. The prompts
alternate between them. Prints each copy's wall time, tau and drafting milliseconds per step.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from downstream.compare import _load_arms, parse_arm  # noqa: E402
from downstream.tasks import get_task  # noqa: E402

from hf_speculative.engine.kernels.linear import ROW_BUCKETS, KernelTable  # noqa: E402
from hf_speculative.engine.policy import SpeedPolicy  # noqa: E402
from hf_speculative.training.data import encode_chat  # noqa: E402


def before(policy: SpeedPolicy, module) -> KernelTable:
    """What a drafter ran before its own table: the model's table's choice for one row, whatever its row count."""
    return KernelTable({bucket: policy.table.kernel_for(1) for bucket in ROW_BUCKETS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arm")
    parser.add_argument("task")
    parser.add_argument("--data", default=None, help="default: ../shared/data/TASK beside the repository")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = args.data or str(ROOT.parent / "shared" / "data" / args.task)
    arms = _load_arms([parse_arm(args.arm)] * 2, args.task, data, None, None)
    records = get_task(args.task).load(data, "test")[args.first : args.first + args.limit]
    prompts = [torch.tensor([encode_chat(arms[0].tokenizer, r.messages)]) for r in records]
    n_new = get_task(args.task).max_new_tokens
    own = SpeedPolicy.drafting_table
    SpeedPolicy.drafting_table = before  # the first copy: the model's one-row kernel at every row count
    arms[0].speculative(prompts[0], 8)
    SpeedPolicy.drafting_table = own
    arms[1].speculative(prompts[0], 8)
    seconds, drafting, steps, tokens = (collections.Counter() for _ in range(4))
    for i, ids in enumerate(prompts):
        for k in ((i + j) % 2 for j in range(2)):
            start = time.perf_counter()
            stats = arms[k].speculative(ids, n_new).speculative_stats
            seconds[k] += time.perf_counter() - start
            drafting[k] += stats.timings["draft"]
            steps[k] += len(stats.accepted_lengths)
            tokens[k] += sum(stats.accepted_lengths)
    for k, name in enumerate(("before (the model's one-row kernel)", "the drafter's own table")):
        print(
            f"{name}: {seconds[k]:.2f} s, tau {tokens[k] / steps[k]:.2f}, "
            f"drafting {1000 * drafting[k] / steps[k]:.2f} ms per step ({steps[k]} steps)"
        )


if __name__ == "__main__":
    main()
