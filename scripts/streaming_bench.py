"""Plain generate vs Speculative Streaming's self-drafting generate, side by side in one process.

    python scripts/streaming_bench.py --streams model_cards/speculative-streaming-smollm2-135m-instruct \
        --limit 4 --max-new-tokens 128 --threads 2 [--tree cartesian:2,2,1] [--output outputs/streaming_small.json]

Same prompts (MT-Bench first turns, chat template), greedy, methods interleaved per prompt. Reports tau
(tokens committed per target forward), tokens/s of each method, speedup and whether the outputs are equal.
`hf-speculative bench --methods plain,speculative-streaming --drafter speculative-streaming=PATH` is the
full benchmark; this script is the small self-contained version.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", required=True, help="a LlamaForSpeculativeStreaming folder")
    p.add_argument("--prompts", default="mt_bench", help="built-in prompt set or prompt file (default mt_bench)")
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--tree",
        default=None,
        help="'cartesian:2,2,1', 'chain:3' or a JSON list of choices (default: the streams' own)",
    )
    p.add_argument("--output", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import hf_speculative as hfs
    from hf_speculative.bench import load_reference_model
    from hf_speculative.bench.harness import parse_tree
    from hf_speculative.bench.prompts import load_prompts

    model, tok = load_reference_model()
    ss = hfs.LlamaForSpeculativeStreaming.from_pretrained(args.streams, base_model=model)
    tree = parse_tree(args.tree)
    questions = load_prompts(args.prompts)[args.offset : args.offset + args.limit]
    common = dict(
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=tok.pad_token_id or tok.eos_token_id,
    )
    rows = []
    for q in questions:
        text = q.turns[0] if hasattr(q, "turns") else q.conversation()[0]["content"]
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt"
        )
        ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
        with torch.inference_mode():
            t0 = time.perf_counter()
            plain = hfs.generation.GenerationMixin.generate(model, ids, **common)
            t1 = time.perf_counter()
            out = ss.generate(
                ids, return_dict_in_generate=True, **({"speculative_tree": tree} if tree is not None else {}), **common
            )
            t2 = time.perf_counter()
        new_plain, new_ss = plain.shape[1] - ids.shape[1], out.sequences.shape[1] - ids.shape[1]
        rows.append(
            {
                "prompt_tokens": ids.shape[1],
                "new_tokens": new_ss,
                "equal": bool(torch.equal(plain, out.sequences)),
                "tau": round(out.speculative_stats.mean_accepted_length, 3),
                "plain_tok_s": round(new_plain / (t1 - t0), 2),
                "ss_tok_s": round(new_ss / (t2 - t1), 2),
            }
        )
        print(rows[-1], flush=True)
    n_plain = sum(r["new_tokens"] for r in rows)
    summary = {
        "prompts": len(rows),
        "tau": round(sum(r["tau"] * r["new_tokens"] for r in rows) / max(n_plain, 1), 3),
        "plain_tok_s": round(sum(r["plain_tok_s"] for r in rows) / len(rows), 2),
        "ss_tok_s": round(sum(r["ss_tok_s"] for r in rows) / len(rows), 2),
        "lossless": f"{sum(r['equal'] for r in rows)}/{len(rows)}",
        "tree": (tree or ss.tree).to_list(),
        "threads": args.threads,
    }
    summary["speedup"] = round(summary["ss_tok_s"] / summary["plain_tok_s"], 3)
    print(json.dumps(summary))
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"summary": summary, "rows": rows, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
