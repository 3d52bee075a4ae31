"""``hf-speculative train eagle``: an EAGLE-1/2 or EAGLE-3 drafter on target-labelled shards (``hf-speculative label``).

    hf-speculative train eagle --model reference --variant eagle3 \\
        --labelled ~/.cache/hf_speculative/labelled/smollm2-sharegpt --out model_cards/eagle-smollm2-135m-instruct \\
        --draft-vocab-size 8192 --max-train-tokens 400000 --time-budget 1200 --threads 1
"""

from __future__ import annotations

import sys

from .common import (
    add_shard_training_args,
    finish_shard_drafter,
    frozen_target,
    labelled_states,
    new_shard_drafter,
    setup_torch,
    timed_training,
)


def add_parser(subparsers) -> None:
    """Register ``train eagle`` on ``subparsers`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser("eagle", help="EAGLE-1/2/3 drafter on the target's cached features (labelled shards)")
    add_shard_training_args(p, lr=1e-3, holdout_help="the last N conversations of each folder are not trained on")
    p.add_argument("--variant", default="eagle3", choices=["eagle1", "eagle2", "eagle3"])
    p.add_argument(
        "--draft-vocab-size", type=int, default=8192, help="EAGLE-3: the draft vocabulary (most frequent tokens)"
    )
    p.add_argument(
        "--ttt-steps",
        type=int,
        default=None,
        help="unrolled training-time-test steps (default: 4 for EAGLE-3, 1 for EAGLE-1/2)",
    )
    p.add_argument("--feature-noise", type=float, default=0.0, help="EAGLE Sec. 4.3 uniform feature noise half width")
    p.add_argument("--total-tokens", type=int, default=24, help="dynamic tree: nodes kept per step")
    p.add_argument("--tree-depth", type=int, default=5)
    p.add_argument("--tree-top-k", type=int, default=4)
    p.add_argument(
        "--init",
        default=None,
        metavar="FOLDER",
        help="continue from this trained EAGLE folder's weights, its variant and draft vocabulary (a fresh optimizer "
        "and schedule; --variant and --draft-vocab-size then do not apply)",
    )
    p.add_argument(
        "--calibrate-conversations",
        type=int,
        default=40,
        help="calibrate the tree on the first N held-out conversations of each folder (--labelled-holdout): the "
        "drafter's accuracy per drafting step and rank, so its default tree is the cost-aware one of the machine it "
        "runs on (0: no calibration)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..drafters.eagle.modeling_eagle import EagleDrafter
    from ..drafters.eagle.training_eagle import calibrate_tree, train_eagle

    earlier = None
    if args.init:
        drafter, draft_vocab_size = _initial_drafter(EagleDrafter, args), None
        earlier = getattr(drafter.config, "training", None)
    else:
        draft_vocab_size = args.draft_vocab_size if args.variant == "eagle3" else None
        names = ("variant", "total_tokens", "tree_depth", "tree_top_k", "feature_noise")
        drafter = new_shard_drafter(EagleDrafter, args, *names, draft_vocab_size=draft_vocab_size)
    L = drafter.num_target_layers
    layers = drafter.config.feature_layers(L)
    # EAGLE-3's draft vocabulary: the most frequent tokens the target produces
    held_per_folder = min(args.calibrate_conversations, args.labelled_holdout)
    states, held = labelled_states(
        args,
        drafter,
        [i for i in layers if i != L],
        f"feature layers {layers}",
        draft_vocab_size=draft_vocab_size,
        held_per_folder=held_per_folder,
    )
    trainer, seconds = timed_training(
        train_eagle,
        drafter,
        states,
        args,
        steps=args.ttt_steps,
        max_length=args.max_length,
        final_layer=L,
        scale_fc=not args.init,  # a trained fc keeps its scale
    )
    if held is not None:
        calibrate_tree(drafter, held, args.max_length, conversations=len(held))
    method = f"{drafter.config.variant} on target-labelled shards (KD on the target's top-k" + (
        ", training-time test)" if drafter.config.is_eagle3 else ", feature regression)"
    )
    if args.init:
        method += f", continued from {args.init}"
    return finish_shard_drafter(args, drafter, method, states, trainer, seconds, earlier=earlier)


def _initial_drafter(drafter_class, args):
    """``--init``: the trained folder's drafter on the `frozen_target`, in float32 for training (its parameters load
    trainable; the trainer switches it to training mode)."""
    import torch

    setup_torch(args)
    drafter = drafter_class.from_pretrained(args.init, base_model=frozen_target(args), dtype=torch.float32)
    drafter.to(args.device)
    print(f"continuing from {args.init} ({drafter.config.variant})", file=sys.stderr)
    return drafter
