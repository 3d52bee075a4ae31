"""``hf-speculative warm-recycling``: fill a Token Recycling matrix by decoding a prompt set, and save it.

    hf-speculative warm-recycling --model reference --prompts alpaca --limit 200 --out tr-smollm2

The saved folder loads with ``TokenRecyclingDrafter.from_pretrained`` (and ``bench --recycling``). Decoding is exact
greedy generation, so the matrix holds the target's own top-k successors of the tokens it met.
"""

from __future__ import annotations

import json

from .common import add_model_args, parse_dtype, setup_torch


def add_parser(subparsers) -> None:
    c = subparsers.add_parser("warm-recycling", help="fill a Token Recycling matrix from a prompt set and save it")
    add_model_args(c)
    c.add_argument(
        "--prompts", required=True, help="a built-in prompt set, a prompt file or a datasets id (as bench takes)"
    )
    c.add_argument("--limit", type=int, default=None, help="first N prompts")
    c.add_argument("--max-new-tokens", type=int, default=128)
    c.add_argument("--num-successors", type=int, default=8, help="k, candidates per token")
    c.add_argument("--start", default=None, help="a saved TokenRecyclingDrafter folder to continue from")
    c.add_argument("--out", required=True, help="output folder")
    c.set_defaults(func=run)


def run(args) -> int:
    setup_torch(args)
    import torch
    from tqdm.auto import tqdm

    import hf_speculative as hfs

    from ..bench.prompts import load_prompts, prepare_prompts
    from ..bench.reference import resolve_model
    from ..hub import resolve_name_or_path

    start = resolve_name_or_path(args.start, what="Token Recycling drafter") if args.start else None
    records = load_prompts(args.prompts, limit=args.limit)
    model, tokenizer = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    hfs.enable(model)
    drafter = (
        hfs.TokenRecyclingDrafter.from_pretrained(start) if start else hfs.TokenRecyclingDrafter(args.num_successors)
    )
    tokens = forwards = 0
    with torch.no_grad():
        for prompt in tqdm(prepare_prompts(records, tokenizer, model.device), desc="warm-recycling", unit="prompt"):
            out = model.generate(
                prompt.input_ids,
                assistant_model=drafter,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                return_dict_in_generate=True,
            )
            stats = out.speculative_stats
            tokens, forwards = tokens + stats.num_new_tokens, forwards + stats.num_target_forwards
    drafter.save_pretrained(args.out)
    tau = tokens / max(forwards, 1)
    _write_card(args, drafter, len(records), tau)
    print(
        json.dumps(
            {"out": str(args.out), "prompts": len(records), "filled_rows": drafter.filled_rows, "tau": round(tau, 3)}
        )
    )
    return 0


def _write_card(args, drafter, num_prompts: int, tau: float) -> None:
    """A short model card: what the folder holds, how it was made, how to load it."""
    from pathlib import Path

    from ..bench.reference import REFERENCE_ALIASES
    from ..model_card import REFERENCE_BASE_MODEL, public_data_source, usage_code, user_data_path
    from ..paths import write_atomically
    from .common import command_line

    base = REFERENCE_BASE_MODEL if args.model in REFERENCE_ALIASES else args.model
    usage = usage_code(base, [f'drafter = hfs.TokenRecyclingDrafter.from_pretrained("{args.out}")'])

    size = (Path(args.out) / "model.safetensors").stat().st_size / 2**20
    prompts, public = f"`{user_data_path(args.prompts)}`", public_data_source(args.prompts)
    source = f" The prompts: {public}." if public else ""
    text = f"""---
library_name: hf_speculative
tags: [speculative-decoding, token-recycling]
---
# Token Recycling matrix for {args.model}

A warm adjacency matrix for `hf_speculative.TokenRecyclingDrafter` (Luo et al., "Turning Trash into Treasure:
Accelerating Inference of Large Language Models with Token Recycling", ACL 2025): for each token the target met, the
{drafter.num_successors} tokens it ranked most likely to follow ({drafter.filled_rows} rows filled, {size:.1f} MiB), and the
drafter's measured hit rates. No trained weights: it was filled by greedy decoding of {num_prompts} prompts from
{prompts} ({args.max_new_tokens} new tokens each; tau {tau:.2f} over the run, learning as it went), and it
keeps learning in every `generate()` call that uses it.{source}

{usage}

Made with:

```bash
{user_data_path(command_line(args) or "hf-speculative warm-recycling")}
```
"""
    write_atomically(Path(args.out) / "README.md", text)
