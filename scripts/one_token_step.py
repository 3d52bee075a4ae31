"""The one-token decoding step of a random-weight target of a published shape: torch's kernels (what plain
``generate()`` runs) against the engine's (the speed policy's table), alternated, best of ``--repeats`` each, after a
``--prefix``-token cache. A direct measurement of the forward, where `hf-speculative bench --shapes` derives the step
from whole ``generate()`` calls (too noisy at a few tokens of an 8B model).

    python scripts/one_token_step.py --shape llama-3.1-8b --dtype bfloat16 --threads 2 --output out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import DynamicCache

    import hf_speculative as hfs
    from hf_speculative._compat import cache_arg
    from hf_speculative.bench.shape_bench import cpu_info
    from hf_speculative.bench.shapes import build_shape_model, random_prompt
    from hf_speculative.engine.policy import speed_policy

    model = build_shape_model(args.shape, args.dtype)
    hfs.enable(model)
    policy = speed_policy(model)
    ids = random_prompt(model.config.vocab_size, args.prefix + 1)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, : args.prefix], **cache_arg(cache), use_cache=True)
        best = {"torch": float("inf"), "engine": float("inf")}
        for _ in range(args.repeats + 1):  # the first round warms up
            for name in best:
                start = time.perf_counter()
                if name == "engine":
                    with policy.engine_kernels(model, rows=1):
                        model(input_ids=ids[:, args.prefix :], **cache_arg(cache), use_cache=True, logits_to_keep=1)
                else:
                    model(input_ids=ids[:, args.prefix :], **cache_arg(cache), use_cache=True, logits_to_keep=1)
                best[name] = min(best[name], time.perf_counter() - start)
                cache.crop(-1)  # a negative count: drop the one new column
    report = {
        "shape": args.shape,
        "dtype": args.dtype,
        "threads": args.threads,
        "prefix": args.prefix,
        "repeats": args.repeats,
        "machine": cpu_info(),
        "kernel_for_one_row": policy.table.kernel_for(1) if policy.table else "torch",
        "torch_step_ms": round(best["torch"] * 1e3, 1),
        "engine_step_ms": round(best["engine"] * 1e3, 1),
        "engine_over_torch": round(best["engine"] / best["torch"], 3),
    }
    text = json.dumps(report, indent=1)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
