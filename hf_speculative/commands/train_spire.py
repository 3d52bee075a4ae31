"""``hf-speculative train spire``: a SPIRe drafter (pruned from the target) on target-labelled shards (``hf-speculative
label``), with SPIRe's MixedLoss.

    hf-speculative train spire --model reference --layers 26,27 \\
        --labelled ~/.cache/hf_speculative/labelled/smollm2-sharegpt --out model_cards/spire-smollm2-135m-instruct \\
        --draft-vocab-size 16384 --max-train-tokens 600000 --time-budget 1800 --threads 2
"""

from __future__ import annotations

import sys

from .common import add_shard_training_args, finish_shard_drafter, labelled_states, new_shard_drafter, timed_training


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_parser(subparsers) -> None:
    """Register ``train spire`` on ``subparsers`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser("spire", help="SPIRe drafter: pruned init, sparse KV, feedback memory (labelled shards)")
    add_shard_training_args(
        p,
        lr=3e-4,
        holdout_help="the last N conversations of each folder are held out (the per-depth acceptance in "
        "the config's calibration)",
    )
    p.add_argument("--num-layers", type=int, default=2, help="drafter layers: the target's last N (SPIRe Sec. 3.2)")
    p.add_argument(
        "--layers",
        type=_int_list,
        default=None,
        help="instead: the target layers to prune from, e.g. 26,27 (their inputs must be in the labelled shards)",
    )
    p.add_argument("--sliding-window", type=int, default=64, help="W of the sparse KV cache (Sec. 3.1)")
    p.add_argument("--sinks", type=int, default=1, help="attention sink tokens (Sec. 3.1)")
    p.add_argument("--k", type=int, default=4, help="drafted tokens per step = training passes (Sec. 3.3)")
    p.add_argument("--top-i", type=int, default=2, help="candidates per depth in the default tree")
    p.add_argument("--omega", type=float, default=0.5, help="MixedLoss omega (Sec. 3.4): omega KD - (1 - omega) alpha")
    p.add_argument(
        "--draft-vocab-size", type=int, default=None, help="FR-Spec draft vocabulary (most frequent target tokens)"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..drafters.spire.modeling_spire import SpireDrafter
    from ..drafters.spire.training_spire import SpireDataset, depth_accuracies, train_spire

    drafter = new_shard_drafter(
        SpireDrafter,
        args,
        "num_layers",
        "layers",
        "sliding_window",
        num_sink_tokens=args.sinks,
        num_draft_tokens=args.k,
        tree_top_i=args.top_i,
        mixed_loss_omega=args.omega,
    )
    layers = drafter.config.target_layers
    what = f"drafter layers from target layers {layers}"
    states, held = labelled_states(args, drafter, layers, what, args.draft_vocab_size, held_per_folder=8)
    held_set = SpireDataset(held, layers, args.sinks, args.max_length) if held is not None else None
    before = depth_accuracies(drafter, held_set) if held_set is not None else None
    trainer, seconds = timed_training(train_spire, drafter, states, args, max_length=args.max_length)
    if held_set is not None:
        after = depth_accuracies(drafter, held_set)
        drafter.config.calibration = {
            "depth_top_i_accuracy": [[round(a, 4) for a in row] for row in after],
            "depth_top_i_accuracy_at_init": [[round(a, 4) for a in row] for row in before],
        }
        print(
            f"held-out top-1 acceptance per depth: init {[r[0] for r in before]} -> trained {[r[0] for r in after]}",
            file=sys.stderr,
        )
    method = f"SPIRe MixedLoss (omega {args.omega}) on target-labelled shards, {args.k} passes per chunk"
    return finish_shard_drafter(args, drafter, method, states, trainer, seconds)
