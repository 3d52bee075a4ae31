"""``hf-speculative warm-suffix``: fill a SuffixDecoding drafter's global structure with outputs, and save it.

    hf-speculative warm-suffix --model reference --texts answers.txt --out sfx-smollm2
    hf-speculative warm-suffix --model reference --prompts ../shared/data/sharegpt/ShareGPT_V3_filtered_1000.json \
        --limit 200 --max-new-tokens 128 --out sfx-smollm2

``--texts`` adds texts as they are (a ``.txt`` file: one per line; ``.json`` / ``.jsonl``: a list of strings or
records with a ``text`` field), encoded with the model's tokenizer; ``--prompts`` decodes a prompt set with the
target (greedy, drafting with the structure as it fills) and adds the target's own outputs. The saved folder loads
with ``SuffixDrafter.from_pretrained`` and ``AutoModel.from_pretrained``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import add_model_args, parse_dtype, setup_torch


def add_parser(subparsers) -> None:
    c = subparsers.add_parser(
        "warm-suffix", help="fill a SuffixDecoding drafter from texts or the target's outputs and save it"
    )
    add_model_args(c)
    c.add_argument("--texts", action="append", default=[], help="a file of outputs to add as they are (repeatable)")
    c.add_argument("--text-field", default="text", help="the field of a JSON record that holds its text")
    c.add_argument(
        "--prompts", default=None, help="a prompt set whose outputs the target decodes and the drafter learns"
    )
    c.add_argument("--limit", type=int, default=None, help="first N prompts / texts of each source")
    c.add_argument("--max-new-tokens", type=int, default=128)
    c.add_argument(
        "--max-cache-mb", type=float, default=None, help="memory cap of the global structure in MiB (default 64)"
    )
    c.add_argument("--start", default=None, help="a saved SuffixDrafter folder to continue from")
    c.add_argument("--out", required=True, help="output folder")
    c.set_defaults(func=run)


def read_texts(path: str, field: str = "text", limit: int | None = None) -> list[str]:
    """The texts of a ``.txt`` (one per line), ``.json`` or ``.jsonl`` file (strings, or records' ``field``)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no texts file at {str(file)!r}")
    raw = file.read_text(encoding="utf-8")
    if file.suffix == ".json":
        items = json.loads(raw)
    elif file.suffix == ".jsonl":
        items = [json.loads(line) for line in raw.splitlines() if line.strip()]
    else:
        items = [line for line in raw.splitlines() if line.strip()]
    texts = [item if isinstance(item, str) else item[field] for item in items]
    return texts[:limit] if limit is not None else texts


def run(args) -> int:
    setup_torch(args)
    import torch
    from tqdm.auto import tqdm

    import hf_speculative as hfs

    from ..bench.prompts import load_prompts, prepare_prompts
    from ..bench.reference import resolve_model
    from ..hub import resolve_name_or_path

    start = resolve_name_or_path(args.start, what="SuffixDecoding drafter") if args.start else None
    texts = [t for path in args.texts for t in read_texts(path, args.text_field, args.limit)]
    records = load_prompts(args.prompts, limit=args.limit) if args.prompts else []
    model, tokenizer = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    hfs.enable(model)
    cap = {} if args.max_cache_mb is None else {"max_cache_bytes": int(args.max_cache_mb * 2**20)}
    drafter = hfs.SuffixDrafter.from_pretrained(start, **cap) if start else hfs.SuffixDrafter(**cap)
    drafter.warm(texts, tokenizer)
    with torch.no_grad():
        for prompt in tqdm(prepare_prompts(records, tokenizer, model.device), desc="warm-suffix", unit="prompt"):
            model.generate(
                prompt.input_ids, assistant_model=drafter, max_new_tokens=args.max_new_tokens, do_sample=False
            )
    drafter.save_pretrained(args.out)
    index = drafter.index
    print(
        json.dumps(
            {
                "out": str(args.out),
                "outputs": len(index),
                "tokens": index.num_tokens,
                "bytes": index.nbytes,
                "max_cache_bytes": index.max_bytes,
            }
        )
    )
    return 0
