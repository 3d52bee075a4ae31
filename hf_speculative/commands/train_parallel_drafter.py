"""``hf-speculative train parallel-drafter``: group-wise parallel training of a ParallelSpec drafter on the
target's cached final hidden states, a calibrated tree and a model card.

    hf-speculative train parallel-drafter --model reference --data examples/data/sharegpt_smollm2_distill.jsonl \\
        --out model_cards/parallel-drafter-smollm2-135m-instruct --num-mask-tokens 4 --target-hidden-states
"""

from __future__ import annotations

from .common import (
    add_calibrated_training_args,
    add_conversation_training_args,
    add_labelled_args,
    curve_callbacks,
    draft_vocab_and_calibration,
    draft_vocab_source,
    finish_drafter,
    new_drafter,
    options,
    setup_torch,
    states_training_report,
    timed_training,
    training_states,
)


def add_parser(subparsers) -> None:
    """Register ``train parallel-drafter`` on ``methods`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser(
        "parallel-drafter", help="ParallelSpec drafter: group-wise parallel training, k [MASK] tokens"
    )
    add_conversation_training_args(
        p, lr=5e-4, epochs=2.0, batch_size=4, batch_help="sequences per step", max_train_tokens=False
    )
    p.add_argument("--num-mask-tokens", type=int, default=4, help="k: one forward drafts k + 1 tokens")
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--init-layer", type=int, default=-1, help="target layer the drafter's (last) layer is copied from")
    p.add_argument(
        "--target-hidden-states",
        action="store_true",
        help="ParallelSpec 4.3: fuse the target's hidden state with each token",
    )
    p.add_argument(
        "--groups-per-sequence", type=int, default=64, help="parallel groups (anchors) drawn per sequence per step"
    )
    p.add_argument("--distill-weight", type=float, default=0.0, help="a in (1-a) CE + a KL(p_target || q)")
    add_calibrated_training_args(p, calibrate_nodes=12, saved="drafter")
    add_labelled_args(p)  # with --distill-weight 1: pure KD against lm_head(h) of the labelled final states
    p.add_argument("--save-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.set_defaults(func=run)


def run(args) -> int:
    setup_torch(args)
    from ..drafters.parallel.modeling_parallel_drafter import ParallelDrafter
    from ..drafters.parallel.training_parallel_drafter import (
        ParallelCurveCallback,
        calibrate_tree,
        depth_accuracies,
        train_parallel_drafter,
    )
    from ..model_card import write_drafter_card

    # the target, every parameter frozen: the drafter shares its embeddings and lm_head
    model, _, train_states, hold_states, counts = training_states(args)
    for p in model.parameters():
        p.requires_grad_(False)
    settings = options(args, "num_mask_tokens", "num_layers", "init_layer", "acceptance")
    drafter = new_drafter(ParallelDrafter, model, args, use_target_hidden_states=args.target_hidden_states, **settings)
    tokens_per_step = args.batch_size * args.groups_per_sequence
    callbacks = curve_callbacks(args, ParallelCurveCallback, drafter, hold_states, 12, tokens_per_step=tokens_per_step)
    trainer, train_s = timed_training(
        train_parallel_drafter,
        drafter,
        train_states,
        args,
        callbacks=callbacks,
        **options(args, "groups_per_sequence", "distill_weight"),
    )
    draft_vocab_and_calibration(
        drafter,
        draft_vocab_source(train_states),
        hold_states,
        args,
        calibrate_tree,
        depth_accuracies,
        "depth_top_i_accuracy",
    )
    drafter.config.training = _training_report(args, counts, train_states, train_s, trainer, callbacks)
    return finish_drafter(args, drafter, write_drafter_card, drafter.config.training)


def _training_report(args, counts: dict, train_states, train_s: float, trainer, callbacks: list) -> dict:
    """The config's ``training`` entry of a ParallelSpec run."""
    history = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "method": "ParallelSpec group-wise parallel training (frozen target, shared embeddings and lm_head)"
        + (", on target-labelled shards" if args.labelled else ""),
        **states_training_report(args, counts, train_states, train_s, callbacks, trainer),
        "steps": trainer.state.global_step,
        "groups_per_sequence": args.groups_per_sequence,
        "train_groups_seen": trainer.state.global_step * args.batch_size * args.groups_per_sequence,
        "distill_weight": args.distill_weight,
        "loss_weights": "lambda_j = 0.8**j",
        "last_logged_loss": round(float(history[-1]["loss"]), 4) if history else None,
        "last_logged_depth_losses": {k: v for k, v in history[-1].items() if k.startswith("loss_depth")}
        if history
        else None,
    }
