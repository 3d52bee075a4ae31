"""tau against context length (the shape of SPIRe's Table 1): held-out ShareGPT conversations cut to L tokens.

    python scripts/context_tau.py spire=model_cards/spire-smollm2-135m-instruct --magicdec \\
        --contexts 256,512,1024 --prompts 8 --max-new-tokens 64 --output docs/results/spire_context_tau.json

Each prompt is the chat-formatted text of a held-out ShareGPT conversation (never labelled or trained on) cut to
its first L tokens; the target continues it greedily for ``--max-new-tokens`` tokens and tau is the committed tokens
per target forward (a property of the drafter and the data, not of the machine's speed). Drafters with a sparse KV
cache (SPIRe, MagicDec) see the sinks and the last W positions only, whatever L is; a drafter with a full cache sees
all L. ``NAME=FOLDER`` loads any drafter folder; ``--magicdec`` adds `hfs.MagicDecDrafter` (window 64, 1 sink).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch


def long_prompts(tokenizer, length: int, count: int, new_tokens: int) -> list[torch.LongTensor]:
    """The first ``count`` held-out conversations with at least ``length + new_tokens`` tokens, cut to ``length``."""
    from hf_speculative.training.data import load_records

    prompts = []
    for record in load_records("sharegpt-heldout"):
        if not record.answers:
            continue
        text = tokenizer.apply_chat_template(record.dialogue(), tokenize=False)
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        if ids.shape[1] >= length + new_tokens:
            prompts.append(ids[:, :length])
        if len(prompts) == count:
            break
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="*", help="NAME=FOLDER drafter folders")
    parser.add_argument("--magicdec", action="store_true", help="also MagicDec (the target with a StreamingLLM cache)")
    parser.add_argument("--contexts", default="256,512,1024")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None, help="JSON of the table")
    args = parser.parse_args()
    os.environ["HF_SPECULATIVE_COST_AWARE"] = "0"  # each drafter's own tree: tau does not depend on this machine
    import hf_speculative as hfs
    from hf_speculative.bench import load_reference_model
    from hf_speculative.bench.harness import load_drafter

    torch.set_num_threads(args.threads)
    model, tok = load_reference_model()
    hfs.enable(model)
    drafters = {}
    for spec in args.drafters:
        name, _, folder = spec.rpartition("=")
        drafters[name or Path(folder).name] = load_drafter(folder, target=model)
    if args.magicdec:
        drafters["magicdec"] = hfs.MagicDecDrafter(model)
    contexts = [int(c) for c in args.contexts.split(",")]
    table: dict[str, dict[int, float]] = {name: {} for name in drafters}
    for length in contexts:
        prompts = long_prompts(tok, length, args.prompts, args.max_new_tokens)
        for name, drafter in drafters.items():
            new = forwards = 0
            for ids in prompts:
                out = model.generate(
                    ids,
                    assistant_model=drafter,
                    max_new_tokens=args.max_new_tokens,
                    do_sample=False,
                    return_dict_in_generate=True,
                )
                new += out.speculative_stats.num_new_tokens
                forwards += out.speculative_stats.num_target_forwards
            table[name][length] = round(new / forwards, 3)
            print(f"L={length}: {name} tau {new / forwards:.3f} ({len(prompts)} prompts)", flush=True)
    print("\n| drafter | " + " | ".join(f"tau @ L={c}" for c in contexts) + " |")
    print("|---|" + "---:|" * len(contexts))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in contexts) + " |")
    if args.output:
        Path(args.output).write_text(
            json.dumps(
                {"contexts": contexts, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "tau": table},
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
