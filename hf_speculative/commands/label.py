"""``hf-speculative label``: run the target once over training conversations and cache what drafters train on
(hidden states, top-k log-probs) in resumable shards (`hf_speculative.training.labelling`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import add_data_arg, add_model_args, options, parse_dtype, setup_torch

DEFAULT_LAYERS = (2, 15, 26, 27, -1)  # mirrors hf_speculative.training.labelling.DEFAULT_LAYERS (no torch import here)


def add_parser(subparsers) -> None:
    """``hf-speculative label``: label conversations with the target into cached shards."""
    p = subparsers.add_parser(
        "label", help="run the target over training conversations; cache hidden states and top-k log-probs"
    )
    add_model_args(p)
    add_data_arg(p)
    p.add_argument(
        "--output", default=None, help="shard folder (default: $HF_SPECULATIVE_CACHE/labelled/<model key>-<data>)"
    )
    p.add_argument("--max-tokens", type=int, default=2_000_000, help="stop once the shards hold this many tokens")
    p.add_argument(
        "--layers",
        type=int,
        nargs="+",
        default=list(DEFAULT_LAYERS),
        help="output_hidden_states indices to store (-1 = the final post-norm state)",
    )
    p.add_argument("--top-k", type=int, default=20, help="teacher log-probs kept per token")
    p.add_argument("--max-length", type=int, default=1024, help="tokens per conversation (longer ones are cut)")
    p.add_argument("--shard-tokens", type=int, default=65536, help="tokens per shard (what a kill can lose)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N conversations")
    p.add_argument(
        "--autocast",
        default=None,
        choices=["bf16", "bfloat16", "fp16", "float16"],
        help="run the decoder layers under torch.autocast in this dtype (lm_head stays float32)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    setup_torch(args)
    from ..bench.reference import resolve_model
    from ..training.data import load_records
    from ..training.labelling import label_conversations, labelled_cache_dir

    records = load_records(args.data, limit=args.limit)
    model, tokenizer = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    out = Path(args.output) if args.output else labelled_cache_dir(model, args.data, args.max_length)
    print(f"labelling {len(records)} conversations of {args.data} into {out}", file=sys.stderr)
    manifest = label_conversations(
        model,
        tokenizer,
        records,
        out,
        autocast=parse_dtype(args.autocast) if args.autocast else None,
        **options(args, "layers", "top_k", "max_tokens", "max_length", "shard_tokens", "data"),
    )
    summary = {
        k: manifest[k] for k in ("num_conversations", "total_tokens", "bytes_per_million_tokens", "tokens_per_second")
    }
    print(json.dumps({"output": str(out), **summary}))
    return 0
