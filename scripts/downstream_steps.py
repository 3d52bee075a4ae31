"""Where a downstream arm's steps go: per-step time split and tau, or each step's accepted chunk and drafts.

    # tau and milliseconds per step (drafting / target forward / engine) of each arm, the order rotating per prompt
    python scripts/downstream_steps.py split ARM [ARM ...] --task e2e_nlg --data ../shared/data/e2e_nlg --limit 30
    # one arm's accepted chunks per step on test prompts 12-19, and (EAGLE) what it drafted at each step
    python scripts/downstream_steps.py trace ARM --task e2e_nlg --data ../shared/data/e2e_nlg --first 12 --limit 8

An arm is ``downstream compare``'s ``FOLDER[:DRAFTER]``. ``HF_SPECULATIVE_PRICING=0`` turns step pricing off, so tau
is the drafter's alone (one-token steps chosen for speed would count as tau 1).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from downstream.compare import _load_arms, parse_arm  # noqa: E402
from downstream.tasks import get_task  # noqa: E402

from hf_speculative.training.data import encode_chat  # noqa: E402


def _prompts(args, tokenizer) -> list[torch.Tensor]:
    records = get_task(args.task).load(args.data, "test")[args.first : args.first + args.limit]
    return [torch.tensor([encode_chat(tokenizer, r.messages)]) for r in records]


def split(args) -> None:
    arms = _load_arms([parse_arm(a) for a in args.arms], args.task, args.data, None, None)
    prompts, n_new = _prompts(args, arms[0].tokenizer), get_task(args.task).max_new_tokens
    for arm in arms:
        arm.speculative(prompts[0], 8)  # warm-up
    timings = [collections.Counter() for _ in arms]
    accepted, seconds = [[] for _ in arms], [0.0] * len(arms)
    for i, ids in enumerate(prompts):
        for k in [(i + j) % len(arms) for j in range(len(arms))]:
            start = time.perf_counter()
            stats = arms[k].speculative(ids, n_new).speculative_stats
            seconds[k] += time.perf_counter() - start
            timings[k].update(stats.timings)
            accepted[k] += list(stats.accepted_lengths)
    for name, t, acc, s in zip(args.arms, timings, accepted, seconds):
        split = ", ".join(f"{key} {1000 * v / len(acc):.1f}" for key, v in sorted(t.items()))
        print(f"{name}: tau {sum(acc) / len(acc):.2f}, {s:.2f} s, {1000 * s / len(acc):.1f} ms per step ({split})")


def trace(args) -> None:
    from hf_speculative.drafters.eagle import modeling_eagle

    (arm,) = _load_arms([parse_arm(args.arms[0])], args.task, args.data, None, None)
    tok = arm.tokenizer
    propose = modeling_eagle.EagleTreeDrafter.propose_batch

    def traced(self, sequences, rows, tree, options):
        drafts = propose(self, sequences, rows, tree, options)
        for seq, draft in zip(sequences, drafts):
            tokens = [tok.decode([t]) for t in draft.tokens.tolist()]
            print(f"  after {tok.decode(seq[0, -3:])!r}: drafted {tokens[1:]}")
        return drafts

    if args.drafts:
        modeling_eagle.EagleTreeDrafter.propose_batch = traced
    for ids in _prompts(args, tok):
        out = arm.speculative(ids, get_task(args.task).max_new_tokens)
        new, chunks, at = out.sequences[0, ids.shape[1] :].tolist(), [], 0
        for n in out.speculative_stats.accepted_lengths:
            chunks.append(tok.decode(new[at : at + n]))
            at += n
        print(" | ".join(chunks).replace("\n", " "))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["split", "trace"])
    p.add_argument("arms", nargs="+")
    p.add_argument("--task", default="e2e_nlg")
    p.add_argument("--data", required=True)
    p.add_argument("--first", type=int, default=0, help="the first test prompt")
    p.add_argument("--limit", type=int, default=12, help="test prompts")
    p.add_argument("--drafts", action="store_true", help="trace: print each EAGLE step's drafted chain too")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        (split if args.mode == "split" else trace)(args)


if __name__ == "__main__":
    main()
