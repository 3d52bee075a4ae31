"""What the Speculative Streaming card's steps cost once its step pricer has learned that its trees do not pay: the
reference model decodes held-out prompts 4-8 through the engine with nothing drafted (`RootOnlyDrafter`, pricing
off, as the bench's ``engine`` method) and with the card as its drafter (pricing on, after prompts 1-3 taught the
pricer), alternating, two rounds; per call, its target forwards, how many verified a drafted tree, and the engine's
timings.

    python docs/results/2026-12-02-cards-avx2/one_token_steps.py   (from any directory)
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import AutoModel

import hf_speculative as hfs
from hf_speculative.bench.prompts import load_prompts
from hf_speculative.bench.reference import resolve_model
from hf_speculative.bench.root_only import RootOnlyDrafter

CARD = Path(__file__).resolve().parents[3] / "model_cards" / "speculative-streaming-smollm2-135m-instruct"


def main() -> None:
    torch.set_num_threads(2)
    model, tokenizer = resolve_model("reference", dtype=torch.float32)
    hfs.enable(model)
    stream = AutoModel.from_pretrained(CARD)
    prompts = [
        tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
            "input_ids"
        ]
        for r in load_prompts("heldout", limit=8)
    ]
    settings = dict(max_new_tokens=64, do_sample=False, return_dict_in_generate=True)
    root_only = RootOnlyDrafter()
    arms = {
        "engine, nothing drafted": lambda ids: model.generate(
            ids, assistant_model=root_only, speculative_pricing=False, **settings
        ),
        "Speculative Streaming card": lambda ids: model.generate(ids, assistant_model=stream, **settings),
    }
    with torch.inference_mode():
        for ids in prompts[:3]:
            arms["Speculative Streaming card"](ids)  # the pricer learns what the card's trees are worth here
        for round_ in range(2):
            for name, generate in arms.items():
                seconds = tokens = 0.0
                for ids in prompts[3:]:
                    start = time.perf_counter()
                    out = generate(ids)
                    seconds += time.perf_counter() - start
                    tokens += out.sequences.shape[1] - ids.shape[1]
                    stats = out.speculative_stats
                    trees = sum(1 for size in stats.tree_sizes if size > 1)
                    timings = {k: round(v, 2) for k, v in stats.timings.items()}
                    print(f"    {name}: {len(stats.tree_sizes)} forwards, {trees} tree steps, seconds {timings}")
                print(f"round {round_ + 1}, {name}: {seconds:.2f} s for {int(tokens)} new tokens")


if __name__ == "__main__":
    main()
