"""The one-token decoding step of a random-weight target of a published shape: torch's kernels (what plain
``generate()`` runs) against the engine's (the speed policy's table), alternated, best of ``--repeats`` each, after a
``--prefix``-token cache (`hf_speculative.bench.shape_bench.measure_one_token_step`, the step the shapes bench
reports), without the rest of the bench.

    python scripts/one_token_step.py --shape llama-3.1-8b --dtype bfloat16 --threads 2 --output out.json
"""

from __future__ import annotations

import argparse
import json

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

    import hf_speculative as hfs
    from hf_speculative.bench.shape_bench import cpu_info, measure_one_token_step
    from hf_speculative.bench.shapes import build_shape_model, random_prompt

    model = build_shape_model(args.shape, args.dtype)
    hfs.enable(model)
    step = measure_one_token_step(model, random_prompt(model.config.vocab_size, args.prefix + 1), args.repeats)
    report = {"shape": args.shape, "dtype": args.dtype, "threads": args.threads, "prefix": args.prefix}
    report.update(
        repeats=args.repeats,
        machine=cpu_info(),
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in step.items()},
    )
    text = json.dumps(report, indent=1)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
