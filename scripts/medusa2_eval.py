"""Medusa-2 evaluation: the adapted model (base + LoRA adapter) timed with plain greedy generate vs tree generate
with its Medusa-2 heads, side by side on MT-Bench first turns; and the change of quality against the base model.

    python scripts/medusa2_eval.py --medusa2 model_cards/medusa2-smollm2-135m-instruct --threads 2 \\
        --per-category 1 --heldout 12 --out outputs/medusa2_eval.json --write-card

Speed (MT-Bench, greedy, 128 new tokens): per prompt, interleaved, timing only the generate call:
  adapted-plain  (base + adapter, merged, plain greedy), adapted-medusa2 (same model, tree with the heads),
  base-plain (the untouched base model; also the reference answers for ROUGE-L on MT-Bench).
tau = new tokens / target forwards (prefill included), as in ``hf-speculative bench``; lossless = the tree
output equals adapted-plain token for token.
Quality: ROUGE-L (F) of the adapted model's greedy answers against the base model's own greedy answers (same
settings) on MT-Bench and on held-out self-distilled prompts (the training command's split), and the held-out
answer LM loss of base vs base + adapter (recorded by the training command, recomputed here).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import hf_speculative as hfs
from hf_speculative.bench import load_reference_model
from hf_speculative.bench.prompts import load_prompts
from hf_speculative.commands.common import split_records
from hf_speculative.drafters.medusa.training_medusa2 import Medusa2Dataset, load_medusa2
from hf_speculative.training.data import encode_chat, load_records


def _generate(model, ids, heads=None, max_new_tokens=128):
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True)
    if heads is not None:
        kw["assistant_model"] = heads
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        dt = time.perf_counter() - t0
    new = out.sequences[0, ids.shape[1] :]
    stats = getattr(out, "speculative_stats", None)
    forwards = stats.num_target_forwards if stats is not None else len(new)
    return new, dt, forwards


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--medusa2", required=True, help="folder written by 'hf-speculative train medusa --medusa2'")
    p.add_argument("--prompts", default="mt_bench", help="built-in prompt set or prompt file (default mt_bench)")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heldout", type=int, default=12, help="held-out self-distilled prompts for ROUGE-L (0: skip)")
    p.add_argument("--out", default="outputs/medusa2_eval.json")
    p.add_argument("--m1-heads", default=None, help="also time these Medusa-1 heads on the base model (base-medusa1)")
    p.add_argument("--write-card", action="store_true", help="store the results in the folder's config and card")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    base, tok = load_reference_model()
    hfs.enable(base)
    fresh, _ = load_reference_model()
    adapted, heads = load_medusa2(args.medusa2, fresh, merge=True)
    hfs.enable(adapted)
    m1 = None
    if args.m1_heads:
        from hf_speculative.drafters.medusa import MedusaHeadsModel

        m1 = MedusaHeadsModel.from_pretrained(args.m1_heads, base_model=base).eval()
    training = heads.config.training or {}

    seen: dict = {}
    questions = [
        r
        for r in load_prompts(args.prompts)
        if seen.setdefault(r.category, []).append(r) or len(seen[r.category]) <= args.per_category
    ]
    from hf_speculative.bench.metrics import load_metric

    rouge = load_metric("rouge")
    # warm-up
    w = torch.tensor([encode_chat(tok, questions[0].messages)])
    for m, h in ((adapted, None), (adapted, heads), (base, None)) + (((base, m1),) if m1 is not None else ()):
        _generate(m, w, h, 8)

    rows = []
    for q in questions:
        ids = torch.tensor([encode_chat(tok, q.messages)])
        a_new, a_s, a_fw = _generate(adapted, ids, None, args.max_new_tokens)
        t_new, t_s, t_fw = _generate(adapted, ids, heads, args.max_new_tokens)
        b_new, b_s, _ = _generate(base, ids, None, args.max_new_tokens)
        extra = {}
        if m1 is not None:
            m_new, m_s, m_fw = _generate(base, ids, m1, args.max_new_tokens)
            extra = dict(m1_s=m_s, m1_forwards=m_fw, m1_lossless=bool(torch.equal(m_new, b_new)))
        rows.append(
            dict(
                **extra,
                id=q.id,
                category=q.category,
                tokens=len(t_new),
                lossless=bool(torch.equal(a_new, t_new)),
                plain_s=a_s,
                tree_s=t_s,
                base_s=b_s,
                forwards=t_fw,
                base_tokens=len(b_new),
                adapted_text=tok.decode(a_new, skip_special_tokens=True),
                base_text=tok.decode(b_new, skip_special_tokens=True),
            )
        )
        r = rows[-1]
        print(
            f"{q.category:12s} tau {r['tokens'] / r['forwards']:.2f} plain {r['tokens'] / a_s:.1f} tok/s tree {r['tokens'] / t_s:.1f} tok/s "
            f"lossless {r['lossless']}",
            file=sys.stderr,
            flush=True,
        )
    tokens = sum(r["tokens"] for r in rows)
    speed = {
        "prompts": len(rows),
        "tau": round(tokens / sum(r["forwards"] for r in rows), 3),
        "adapted_plain_tokens_per_s": round(tokens / sum(r["plain_s"] for r in rows), 2),
        "adapted_medusa2_tokens_per_s": round(tokens / sum(r["tree_s"] for r in rows), 2),
        "base_plain_tokens_per_s": round(sum(r["base_tokens"] for r in rows) / sum(r["base_s"] for r in rows), 2),
        "speedup_vs_adapted_plain": round(sum(r["plain_s"] for r in rows) / sum(r["tree_s"] for r in rows), 3),
        "speedup_per_prompt_median": round(statistics.median(r["plain_s"] / r["tree_s"] for r in rows), 3),
        "lossless_rate": sum(r["lossless"] for r in rows) / len(rows),
        "rougeL_adapted_vs_base_mt_bench": round(
            rouge.compute(predictions=[r["adapted_text"] for r in rows], references=[r["base_text"] for r in rows])[
                "rougeL"
            ],
            4,
        ),
        "identical_answers_mt_bench": sum(r["adapted_text"] == r["base_text"] for r in rows),
    }
    if m1 is not None:
        base_tokens = sum(r["base_tokens"] for r in rows)
        speed["base_medusa1"] = {
            "heads": args.m1_heads,
            "tau": round(base_tokens / sum(r["m1_forwards"] for r in rows), 3),
            "tokens_per_s": round(base_tokens / sum(r["m1_s"] for r in rows), 2),
            "speedup_vs_base_plain": round(sum(r["base_s"] for r in rows) / sum(r["m1_s"] for r in rows), 3),
            "lossless_rate": sum(r["m1_lossless"] for r in rows) / len(rows),
        }
    quality = {}
    if args.heldout and training.get("data"):
        records = [r for r in load_records(training["data"]) if r.answers]
        records = records[: training["limit"]] if training.get("limit") else records
        _, held = split_records(records, training.get("holdout", 0.1), training.get("seed", 0))
        held = held[: args.heldout]
        preds, refs = [], []
        for r in held:
            ids = torch.tensor([encode_chat(tok, r.messages)])
            preds.append(tok.decode(_generate(adapted, ids, heads, args.max_new_tokens)[0], skip_special_tokens=True))
            refs.append(tok.decode(_generate(base, ids, None, args.max_new_tokens)[0], skip_special_tokens=True))
        ds = Medusa2Dataset(tok, held, max_length=training.get("max_length") or 512)
        quality = {
            "heldout_prompts": len(held),
            "rougeL_adapted_vs_base_heldout": round(rouge.compute(predictions=preds, references=refs)["rougeL"], 4),
            "identical_answers_heldout": sum(a == b for a, b in zip(preds, refs)),
            "heldout_lm_loss_base (training record)": training.get("held_out_lm_loss_base"),
            "heldout_lm_loss_adapted (training record)": training.get("held_out_lm_loss_adapted"),
            "heldout_answer_tokens_here": ds.num_answer_tokens,
        }
    result = {
        "setting": f"SmolLM2-135M-Instruct fp32 + Medusa-2 adapter (merged), CPU, torch {args.threads} threads (machine shared "
        f"with other jobs), greedy, {args.max_new_tokens} new tokens, {len(rows)} MT-Bench first turns "
        f"(first {args.per_category} per category)",
        "command": "python " + " ".join(sys.argv),
        "speed": speed,
        "quality": quality,
        "per_prompt": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({"speed": speed, "quality": quality}, indent=1))
    if args.write_card:
        from hf_speculative.model_card import write_drafter_card

        heads.config.results = {k: v for k, v in result.items() if k != "per_prompt"}
        heads.save_pretrained(args.medusa2)
        write_drafter_card(heads, args.medusa2)


if __name__ == "__main__":
    main()
