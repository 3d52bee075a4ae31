"""Demo: SmolLM2-135M-Instruct answers chat prompts with and without tree speculative decoding.

    python examples/demo.py [--prompts 6] [--max-new-tokens 128] [--threads 2] [--drafter prompt-lookup|medusa|FOLDER]

``--drafter``: ``prompt-lookup`` (default: the model-free n-gram tree drafter, the one measured faster
than plain decoding on this CPU), ``medusa`` (the trained reference Medusa heads committed in
`model_cards/`, the embedded default a user would otherwise download from the Hub), or a drafter folder (any hf_speculative drafter or small causal LM). For each prompt the demo
runs plain greedy `generate()` and `generate(assistant_model=drafter)` in this process, checks the two
outputs are identical, and prints tokens/s, tau (tokens per target forward) and the speedup.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import transformers

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model

ROOT = Path(__file__).resolve().parents[1]
HEADS = ROOT / "model_cards" / "medusa-smollm2-135m-instruct"
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench" / "question.jsonl"
FALLBACK_PROMPTS = [
    "Write a short poem about the ocean.",
    "Explain what a hash table is in two sentences.",
    "Give me three tips for learning a new language.",
    "What is the capital of France, and what is it famous for?",
    "Summarize the plot of Romeo and Juliet.",
    "List the planets of the solar system in order.",
]


def _drafter(args, model):
    if args.drafter == "prompt-lookup":
        return hfs.PromptLookupDrafter(), "n-gram tree drafter (prompt lookup, no draft model, 16-node budget)"
    if args.drafter != "medusa":
        from hf_speculative.bench.harness import load_drafter

        return load_drafter(args.drafter, model), f"drafter from {args.drafter}"
    try:
        heads = hfs.MedusaHeadsModel.from_pretrained(args.heads, base_model=model)
        return heads, f"Medusa heads from {args.heads} ({heads.config.num_heads} heads, tree of {heads.tree.num_nodes} nodes)"
    except OSError as err:  # no such folder and no Hub access
        return hfs.PromptLookupDrafter(), f"no trained heads ({err.__class__.__name__}): the n-gram tree drafter"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafter", default="prompt-lookup",
                        help="prompt-lookup (default: the drafter that is faster than plain on this CPU) | medusa | a drafter folder")
    parser.add_argument("--heads", default=str(HEADS), help="the Medusa heads folder (or Hub id) for --drafter medusa")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (trees verify cheaper with 2 on this CPU)")
    parser.add_argument("--show", type=int, default=2, help="print this many answers")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_reference_model()
    hfs.enable(model)
    drafter, what = _drafter(args, model)

    if MT_BENCH.exists():
        questions = [json.loads(line)["turns"][0] for line in open(MT_BENCH)]
        texts = [questions[i] for i in range(0, len(questions), max(1, len(questions) // args.prompts))][: args.prompts]
    else:
        texts = FALLBACK_PROMPTS[: args.prompts]

    print(f"target: SmolLM2-135M-Instruct fp32 on CPU ({torch.get_num_threads()} threads); drafter: {what}\n")
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    warm = tokenizer("Hello", return_tensors="pt")["input_ids"]
    transformers.GenerationMixin.generate(model, warm, max_new_tokens=8)
    model.generate(warm, assistant_model=drafter, max_new_tokens=8)

    rows = []
    for i, text in enumerate(texts):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        start = time.perf_counter()
        plain = transformers.GenerationMixin.generate(model, ids, **common)
        t_plain = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, assistant_model=drafter, return_dict_in_generate=True, **common)
        t_spec = time.perf_counter() - start
        new = plain.shape[1] - ids.shape[1]
        same = torch.equal(plain, out.sequences)
        rows.append((new / t_plain, new / t_spec, out.speculative_stats.mean_accepted_length, same))
        print(f"[{i + 1}] {text[:70]!r}: plain {new / t_plain:5.1f} tok/s | speculative {new / t_spec:5.1f} tok/s | "
              f"tau {rows[-1][2]:.2f} | speedup {t_plain / t_spec:.2f}x | identical output: {same}")
        if i < args.show:
            print("    " + tokenizer.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True).replace("\n", "\n    ")[:600])
    print(
        f"\nmean over {len(rows)} prompts: plain {statistics.mean(r[0] for r in rows):.1f} tok/s, speculative "
        f"{statistics.mean(r[1] for r in rows):.1f} tok/s, tau {statistics.mean(r[2] for r in rows):.2f}, "
        f"speedup {statistics.mean(r[1] / r[0] for r in rows):.2f}x, identical outputs {sum(r[3] for r in rows)}/{len(rows)}"
    )


if __name__ == "__main__":
    main()
