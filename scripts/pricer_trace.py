"""What the step pricer decided, step by step, for one drafter on the reference model: per prompt its speedup over
plain `generate()` (decoded right after it), tau, its tree steps (count, ms and tokens each) and one-token steps
(count, ms each), and the plan as a string: ``.`` a one-token step, ``T`` a tree step that committed one token, a
digit one that committed that many (9 for 9 or more).

    python scripts/pricer_trace.py --drafter model_cards/speculative-streaming-smollm2-135m-instruct --limit 8
    python scripts/pricer_trace.py --drafter suffix --max-new-tokens 96

``--drafter``: a drafter folder (as `hf-speculative bench --drafter` takes), or ``suffix``, ``prompt-lookup`` or
``token-recycling``. The pricer keeps its prices across the prompts, as it does across ``generate()`` calls; one
untimed call warms it first.
"""

from __future__ import annotations

import argparse
import time

import torch


def _drafter(name: str, model):
    import hf_speculative as hfs
    from hf_speculative.bench.harness import load_drafter

    builtin = {"suffix": hfs.SuffixDrafter, "prompt-lookup": hfs.PromptLookupDrafter}
    builtin["token-recycling"] = hfs.TokenRecyclingDrafter
    return builtin[name]() if name in builtin else load_drafter(name, model)


def _plan(steps: list[tuple[bool, float, int]]) -> str:
    return "".join(("T" if tokens == 1 else str(min(tokens, 9))) if drafted else "." for drafted, _, tokens in steps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", required=True)
    p.add_argument("--prompts", default="heldout")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import hf_speculative as hfs
    from hf_speculative.bench.prompts import load_prompts, prepare_prompts
    from hf_speculative.bench.reference import load_reference_model
    from hf_speculative.bench.shape_bench import cpu_info
    from hf_speculative.engine.step_pricing import StepPricer

    model, tokenizer = load_reference_model()
    hfs.enable(model)
    drafter = _drafter(args.drafter, model)
    steps: list[tuple[bool, float, int]] = []
    record = StepPricer.record

    def traced(self, drafted, seconds, tokens, rows):
        steps.append((drafted, seconds, tokens))
        return record(self, drafted, seconds, tokens, rows)

    StepPricer.record = traced
    prompts = prepare_prompts(load_prompts(args.prompts, limit=args.limit), tokenizer)
    model.generate(prompts[0].input_ids, max_new_tokens=16, do_sample=False, assistant_model=drafter)
    print(f"{args.drafter} on {cpu_info()}, {args.threads} threads, {args.max_new_tokens} new tokens at most")
    for prompt in prompts:
        first = len(steps)
        start = time.perf_counter()
        out = model.generate(
            prompt.input_ids,
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            assistant_model=drafter,
            return_dict_in_generate=True,
        )
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(prompt.input_ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        plain = time.perf_counter() - start
        mine = steps[first:]
        tree = [s for s in mine if s[0]]
        one = [s for s in mine if not s[0]]
        tree_ms = 1000 * sum(s[1] for s in tree) / max(len(tree), 1)
        tree_tokens = sum(s[2] for s in tree) / max(len(tree), 1)
        one_ms = 1000 * sum(s[1] for s in one) / max(len(one), 1)
        print(
            f"{plain / seconds:.3f}x tau {out.speculative_stats.mean_accepted_length:.2f} | tree steps {len(tree)}, "
            f"{tree_ms:.1f} ms, {tree_tokens:.2f} tokens | one-token steps {len(one)}, {one_ms:.1f} ms | {_plan(mine)}"
        )
    StepPricer.record = record
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
