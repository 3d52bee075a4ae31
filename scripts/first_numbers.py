"""First numbers: plain greedy vs transformers' assisted decoding vs our chain vs our tree, one draft.

    python scripts/first_numbers.py --prompts 10 --max-new-tokens 128

Target: SmolLM2-135M-Instruct (the reference model). Draft: no smaller model shares its tokenizer, so the
draft is SELF-SPECULATIVE: some of SmolLM2's own decoder layers + its final norm and LM head
(`hf_speculative.layer_cut_draft`). Every method runs on the same prompts in this one process, after a
warm-up; wall time covers the `generate` call only. tau = new tokens / target forward passes (counted by
a forward hook for transformers' own methods). Also reports the engine's own work per tree step (masks,
acceptance, cache compaction) against one plain decoding step.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

import hf_speculative as hfs
from hf_speculative.bench import load_prompts, load_reference_model


def parse_layers(text: str) -> dict:
    if text.startswith("first"):
        return {"num_layers": int(text[5:])}
    return {"layers": [int(i) for i in text.split(",")]}


class ForwardCounter:
    """Counts target forward passes (an int increment in a hook; nothing else in the timed region)."""

    def __init__(self, model):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, *args):
        self.count += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=10, help="MT-Bench first turns to use")
    parser.add_argument(
        "--prompt-file", default="mt_bench", help="built-in prompt set or prompt file (default mt_bench)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--draft-layers", default="first8", help="'firstN' or a comma list of layer indices")
    parser.add_argument("--chain", type=int, default=4, help="chain length (ours and transformers' assisted)")
    parser.add_argument("--tree", default="8,2,1", help="Cartesian branching of our tree")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", default=None, help="write the results as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_reference_model()
    hfs.enable(model)
    draft = hfs.layer_cut_draft(model, **parse_layers(args.draft_layers))
    # transformers' assisted decoding reads these from the ASSISTANT's generation config
    draft.generation_config.num_assistant_tokens = args.chain
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    chain = hfs.TreeSpec.chain(args.chain)
    tree = hfs.TreeSpec.cartesian([int(b) for b in args.tree.split(",")])

    questions = [{"turns": r.turns} for r in load_prompts(args.prompt_file, limit=args.prompts)]
    prompts = []
    for q in questions:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        prompts.append(ids)

    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    methods = {
        "plain": lambda ids: transformers.GenerationMixin.generate(model, ids, **common),
        "hf-assisted (chain)": lambda ids: transformers.GenerationMixin.generate(
            model, ids, assistant_model=draft, **common
        ),
        f"ours chain ({chain.num_nodes} nodes)": lambda ids: model.generate(
            ids, assistant_model=draft, speculative_tree=chain, return_dict_in_generate=True, **common
        ),
        f"ours tree ({tree.num_nodes} nodes)": lambda ids: model.generate(
            ids, assistant_model=draft, speculative_tree=tree, return_dict_in_generate=True, **common
        ),
    }
    for run in methods.values():  # warm-up
        run(prompts[0][:, :16])

    # methods interleaved per prompt, so a change of machine load affects all of them alike
    records = {name: [] for name in methods}
    outputs = {name: [] for name in methods}
    engine = {name: [0.0, 0] for name in methods}
    for ids in prompts:
        for name, run in methods.items():
            counter = ForwardCounter(model)
            start = time.perf_counter()
            out = run(ids)
            elapsed = time.perf_counter() - start
            counter.handle.remove()
            seq = out.sequences if hasattr(out, "sequences") else out
            forwards = counter.count
            if hasattr(out, "speculative_stats"):
                forwards = out.speculative_stats.num_target_forwards
                engine[name][0] += out.speculative_stats.timings["engine"]
                engine[name][1] += forwards - 1
            records[name].append({"new_tokens": seq.shape[1] - ids.shape[1], "seconds": elapsed, "forwards": forwards})
            outputs[name].append(seq)
    results = {}
    for name, per_prompt in records.items():
        tokens = sum(p["new_tokens"] for p in per_prompt)
        results[name] = {
            "tau": tokens / sum(p["forwards"] for p in per_prompt),
            "tokens_per_s": tokens / sum(p["seconds"] for p in per_prompt),
            "per_prompt_tps": [p["new_tokens"] / p["seconds"] for p in per_prompt],
            "engine_s_per_step": engine[name][0] / engine[name][1] if engine[name][1] else None,
        }

    plain = results["plain"]
    plain_step = 1.0 / plain["tokens_per_s"]
    hf = results["hf-assisted (chain)"]
    print(
        f"\nTarget SmolLM2-135M-Instruct (fp32, {platform.machine()}, {torch.get_num_threads()} threads); "
        f"draft: SELF-SPECULATIVE layer-cut SmolLM2 ({args.draft_layers} layers + final norm + head), "
        f"{len(prompts)} MT-Bench first turns, {args.max_new_tokens} new tokens, greedy.\n"
    )
    print(
        "| method | tau | tokens/s | speedup vs plain | speedup vs hf-assisted | lossless | engine work / plain step |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        speedup = statistics.mean(a / b for a, b in zip(r["per_prompt_tps"], plain["per_prompt_tps"]))
        vs_hf = statistics.mean(a / b for a, b in zip(r["per_prompt_tps"], hf["per_prompt_tps"]))
        lossless = sum(torch.equal(a, b) for a, b in zip(outputs[name], outputs["plain"])) / len(prompts)
        eng = f"{100 * r['engine_s_per_step'] / plain_step:.1f}%" if r["engine_s_per_step"] else "-"
        r.update(speedup=speedup, speedup_vs_hf_assisted=vs_hf, lossless_rate=lossless)
        print(
            f"| {name} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | {speedup:.2f}x | {vs_hf:.2f}x | {100 * lossless:.0f}% | {eng} |"
        )
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
