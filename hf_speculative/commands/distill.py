"""``hf-speculative distill``: self-distillation, the model answers prompts, written as chat jsonl."""

from __future__ import annotations

from .common import DEFAULT_SHAREGPT, add_model_args, parse_dtype, setup_torch


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("distill", help="self-distillation: the model answers prompts, written as chat jsonl")
    add_model_args(p)
    p.add_argument(
        "--prompts", default=DEFAULT_SHAREGPT, help="prompt file (any format of hf_speculative.training.data)"
    )
    p.add_argument("--out", required=True, help="output jsonl (appended to; ids already there are skipped)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=None, help="stop when the output holds this many records")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate() call (left padding)")
    p.add_argument("--all-turns", action="store_true", help="answer every user turn, not only the first")
    p.add_argument(
        "--drafter",
        choices=("none", "suffix"),
        default="none",
        help="suffix: decode the batches speculatively with SuffixDecoding, warmed with the answers already in --out "
        "and learning each new one (the same answers; faster than plain at small batches, slower at 32 on CPU)",
    )
    p.add_argument(
        "--sort-window",
        type=int,
        default=0,
        help="sort each run of N prompts by length, so batches pad to similar lengths (0: the file's order)",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="leave out prompts whose first turn is longer")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds after which no new batch starts (nor one that, as long as the one before, would end after them)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    setup_torch(args)
    from ..bench.reference import resolve_model
    from ..training.data import load_records
    from ..training.distill import self_distill

    records = load_records(args.prompts)
    model, tokenizer = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    stats = self_distill(
        model,
        tokenizer,
        records,
        args.out,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        batch_size=args.batch_size,
        all_turns=args.all_turns,
        limit=args.limit,
        time_budget_s=args.time_budget,
        seed=args.seed,
        assistant_model=_suffix_drafter(model, tokenizer, args.out) if args.drafter == "suffix" else None,
        sort_window=args.sort_window,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    print(stats)
    return 0


def _suffix_drafter(model, tokenizer, out):
    """A `SuffixDrafter` warmed with the assistant turns already in ``out`` (each ended by EOS, as answers end);
    ``model`` enabled for it."""
    from pathlib import Path

    import hf_speculative as hfs

    from ..training.data import load_records
    from ..training.distill import read_done_ids

    read_done_ids(out)  # cuts a torn last line off, as self_distill does
    answers = [a for r in load_records(out) for a in r.answers] if Path(out).is_file() else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    hfs.enable(model)
    return hfs.SuffixDrafter().warm([tokenizer(a, add_special_tokens=False)["input_ids"] + eos for a in answers])
