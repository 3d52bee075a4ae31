"""tau of sampled decoding under the two exact acceptance rules, same prompts, same run.

    python scripts/sampling_tau.py --prompts 8 --max-new-tokens 64 --temperatures 0.7,1.0 \\
        --output docs/results/sampling_tau.json

``exact`` (the default) draws every token by position-keyed Gumbel-max noise: drafters propose deterministic top-k
candidates and a seeded call gives the same tokens whatever its steps drafted. ``rejection`` is tree rejection
sampling over the drafters' own sampled siblings (SpecInfer): the randomness a call consumes depends on its steps.
Both are exact in distribution; this measures what each accepts (tau: committed tokens per target forward) for a
deterministic drafter (tree prompt lookup) and a sampling one (the committed Medusa heads). Step pricing is off, so
every step drafts and tau is the acceptance alone (not a timing; the machine's load does not change it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def drafters(model):
    import hf_speculative as hfs

    medusa = hfs.MedusaHeadsModel.from_pretrained(
        REPO / "model_cards" / "medusa-smollm2-135m-instruct", base_model=model
    )
    return {"tree prompt lookup": lambda: hfs.PromptLookupDrafter(), "Medusa heads (committed card)": lambda: medusa}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output")
    args = parser.parse_args()
    import hf_speculative as hfs
    from hf_speculative.bench import load_reference_model
    from hf_speculative.bench.prompts import load_prompts

    torch.set_num_threads(1)
    model, tok = load_reference_model()
    hfs.enable(model)
    records = load_prompts("heldout", limit=args.prompts)
    rows = []
    for name, make in drafters(model).items():
        for temperature in [float(t) for t in args.temperatures.split(",")]:
            for acceptance in ("exact", "rejection"):
                tokens = forwards = 0
                for i, record in enumerate(records):
                    enc = tok.apply_chat_template(
                        record.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
                    )
                    torch.manual_seed(args.seed + i)
                    out = model.generate(
                        **enc,
                        assistant_model=make(),
                        do_sample=True,
                        temperature=temperature,
                        max_new_tokens=args.max_new_tokens,
                        speculative_acceptance=acceptance,
                        speculative_pricing=False,
                        return_dict_in_generate=True,
                    )
                    stats = out.speculative_stats
                    tokens, forwards = tokens + stats.num_new_tokens, forwards + stats.num_target_forwards
                rows.append(dict(drafter=name, temperature=temperature, acceptance=acceptance, tau=tokens / forwards))
                print(f"{name:32s} T={temperature:<4} {acceptance:9s} tau {tokens / forwards:.3f}", flush=True)
    if args.output:
        from hf_speculative.bench.report import write_json

        write_json(dict(settings=vars(args), rows=rows), args.output)


if __name__ == "__main__":
    main()
