"""One-token forwards of the reference model through the engine's decoder loop and through the model's own forward,
alternated on one cache (cropped back after each) inside the engine's kernels, as the engine runs them: medians.

    python scripts/decoder_loop_step.py --calls 400 --threads 2
    python scripts/decoder_loop_step.py --shape qwen2.5-0.5b --calls 100   # random weights at a published shape
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shape", default=None, help="a shape of hf_speculative.perf_model.SHAPES, random float32 weights")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import DynamicCache

    import hf_speculative as hfs
    from hf_speculative._compat import cache_arg
    from hf_speculative.bench import load_reference_model
    from hf_speculative.bench.shape_bench import cpu_info
    from hf_speculative.engine.cache import prepare_tree_cache

    if args.shape is None:
        model, tok = load_reference_model()
        ids = tok("The quick brown fox jumps over the lazy dog. " * 20, return_tensors="pt").input_ids
    else:
        from hf_speculative.bench.shapes import build_shape_model

        model = build_shape_model(args.shape, dtype="float32")
        ids = torch.randint(0, model.config.vocab_size, (1, 201), generator=torch.Generator().manual_seed(0))
    policy = hfs.enable(model)._hfs_policy
    times = {"model": [], "loop": []}
    with torch.inference_mode():
        loop = policy.decoder_loop(model)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, **cache_arg(cache), use_cache=True)
        prepare_tree_cache(cache)
        token, position, no_rows = ids[:, -1:], torch.tensor([[ids.shape[1]]]), torch.empty(0, dtype=torch.long)
        for i in range(args.calls):
            for kind in ("model", "loop") if i % 2 else ("loop", "model"):
                with policy.engine_kernels(model, rows=1):
                    start = time.perf_counter()
                    if kind == "model":
                        model(input_ids=token, position_ids=position, **cache_arg(cache), logits_to_keep=no_rows)
                    else:
                        loop(token, position, cache, logits_to_keep=no_rows)
                    times[kind].append(time.perf_counter() - start)
                cache.crop(-1)
    name = args.shape or "the reference model"
    print(f"{name}; {cpu_info()}; {args.threads} threads; a {ids.shape[1]}-token cache; {policy.loop_report(model)}")
    for kind, values in times.items():
        print(f"{kind}: median {1e3 * statistics.median(values):.2f} ms over {len(values)} one-token forwards")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
