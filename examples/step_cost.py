"""Cost of one verification forward over n tree tokens, in plain decoding steps, on the reference model.

    python examples/step_cost.py --threads 1 --nodes 8,16,29,40

Times (best of 5) a target forward over n new tokens after a cached prefix, with logits for one row
(what the engine computes when it applies the LM head lazily) and for all n rows, divided by the time of
a one-token decoding step. A tree of n nodes pays off when tau exceeds this ratio plus the drafting cost.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

from hf_speculative.bench import load_reference_model
from hf_speculative.cache import crop_to


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prefix", type=int, default=120)
    parser.add_argument("--nodes", default="8,16,29,40")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_reference_model()
    ids = torch.randint(0, model.config.vocab_size, (1, args.prefix + 64), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, : args.prefix], past_key_values=cache, use_cache=True)

        def timed(n: int, keep: int) -> float:
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                model(input_ids=ids[:, args.prefix : args.prefix + n], past_key_values=cache, use_cache=True, logits_to_keep=keep)
                best = min(best, time.perf_counter() - start)
                crop_to(cache, args.prefix)
            return best

        one = timed(1, 1)
        print(f"one decoding step: {1000 * one:.1f} ms ({torch.get_num_threads()} threads, prefix {args.prefix})")
        print("| new tokens | LM head on 1 row | LM head on all rows |\n|---:|---:|---:|")
        for n in (int(x) for x in args.nodes.split(",")):
            print(f"| {n} | {timed(n, 1) / one:.2f}x | {timed(n, 0) / one:.2f}x |")


if __name__ == "__main__":
    main()
