"""What an EAGLE-3 drafting step costs inside the hybrid's decoding: each drafting step, its pass over the new
committed rows and its one-row forwards, timed in place.

    python docs/results/2026-12-01-e2e-names/drafting_time.py model_cards/eagle3-smollm2-135m-e2e-nlg:hybrid-suffix \
        --task e2e_nlg --limit 15
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
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import downstream_steps  # noqa: E402
from downstream.compare import _load_arms, parse_arm  # noqa: E402
from hybrid_variants import prompt_args  # noqa: E402

from hf_speculative.drafters.eagle import drafting, modeling_eagle  # noqa: E402

TIMES: dict[str, list[float]] = collections.defaultdict(list)


def timed(name, fn):
    def run(*args):
        start = time.perf_counter()
        out = fn(*args)
        TIMES[name].append(1000 * (time.perf_counter() - start))
        return out

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arm")
    args = prompt_args(p, limit=15)

    drafting.committed_rows = timed("the pass over the new committed rows", drafting.committed_rows)
    drafting.TreeRows.run = timed("one tree depth's forward", drafting.TreeRows.run)
    modeling_eagle.propose_rows = timed("drafting step", modeling_eagle.propose_rows)
    with torch.inference_mode():
        (arm,) = _load_arms([parse_arm(args.arm)], args.task, args.data, None, None)
        prompts = downstream_steps._prompts(args, arm.tokenizer)
        arm.speculative(prompts[0], 8)  # warm-up
        TIMES.clear()
        for ids in prompts:
            arm.speculative(ids, 64)
    for name, ms in TIMES.items():
        print(f"{name}: {len(ms)} times, mean {sum(ms) / len(ms):.2f} ms, median {sorted(ms)[len(ms) // 2]:.2f} ms")


if __name__ == "__main__":
    main()
