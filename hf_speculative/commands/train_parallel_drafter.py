"""``hf-speculative train parallel-drafter``: group-wise parallel training of a ParallelSpec drafter on the
target's cached final hidden states, a calibrated tree and a model card.

    hf-speculative train parallel-drafter --model reference --data examples/data/sharegpt_smollm2_distill.jsonl \\
        --out model_cards/parallel-drafter-smollm2-135m-instruct --num-mask-tokens 4 --target-hidden-states
"""

from __future__ import annotations

import time
from pathlib import Path

from .common import (
    add_calibrated_training_args,
    add_data_arg,
    add_labelled_args,
    add_model_args,
    add_train_args,
    batch_report,
    command_line,
    draft_vocab_and_calibration,
    draft_vocab_source,
    finish_drafter,
    labelled_training_states,
    load_model_and_records,
    record_reference_base,
    run_control,
    setup_torch,
    split_hidden_states,
)


def add_parser(subparsers) -> None:
    """Register ``train parallel-drafter`` on ``methods`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser(
        "parallel-drafter", help="ParallelSpec drafter: group-wise parallel training, k [MASK] tokens"
    )
    add_model_args(p)
    add_data_arg(p)
    add_train_args(p, lr=5e-4, epochs=2.0, batch_size=4, batch_help="sequences per step", max_train_tokens=False)
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
    from ..drafters.parallel.training_parallel_drafter import calibrate_tree, depth_accuracies, train_parallel_drafter
    from ..model_card import write_drafter_card

    model, train_states, hold_states, counts = _frozen_target_and_states(args)
    drafter = ParallelDrafter.from_base_model(
        model,
        num_mask_tokens=args.num_mask_tokens,
        num_layers=args.num_layers,
        init_layer=args.init_layer,
        use_target_hidden_states=args.target_hidden_states,
        acceptance=args.acceptance,
    )
    record_reference_base(drafter.config, args.model)
    callbacks = _curve_callbacks(args, drafter, hold_states)
    t0 = time.perf_counter()
    trainer = train_parallel_drafter(
        drafter,
        train_states,
        output_dir=str(Path(args.out) / "trainer_state"),
        num_epochs=args.epochs,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        groups_per_sequence=args.groups_per_sequence,
        distill_weight=args.distill_weight,
        max_steps=args.max_steps,
        seed=args.seed,
        callbacks=callbacks,
        time_budget=args.time_budget,
        **run_control(args),
    )
    train_s = time.perf_counter() - t0
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


def _frozen_target_and_states(args):
    """(target, train states, held-out states, counts): the target with every parameter frozen (the drafter
    shares its embeddings and lm_head), and the hidden states of ``--data`` or the ``--labelled`` shards."""
    if args.labelled:
        model, _, train_states, hold_states, counts = labelled_training_states(args)
    else:
        model, tokenizer, records = load_model_and_records(args)
        train_states, hold_states, counts = split_hidden_states(model, tokenizer, records, args)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, train_states, hold_states, counts


def _curve_callbacks(args, drafter, hold_states) -> list:
    """With held-out states and ``--curve-points``: the callback that records the learning curve; else none."""
    if hold_states is None or not args.curve_points:
        return []
    from ..drafters.parallel.training_parallel_drafter import ParallelCurveCallback

    curve = ParallelCurveCallback(
        drafter,
        hold_states,
        num_nodes=args.calibrate_nodes or 12,
        num_points=args.curve_points,
        save_dir=args.curve_checkpoints,
        tokens_per_step=args.batch_size * args.groups_per_sequence,
    )
    return [curve]


def _training_report(args, counts: dict, train_states, train_s: float, trainer, callbacks: list) -> dict:
    """The config's ``training`` entry of a ParallelSpec run."""
    history = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "method": "ParallelSpec group-wise parallel training (frozen target, shared embeddings and lm_head)"
        + (", on target-labelled shards" if args.labelled else ""),
        "data": ", ".join(args.labelled) if args.labelled else str(args.data),
        **counts,
        "train_answer_tokens": train_states.num_train_tokens,
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "steps": trainer.state.global_step,
        **batch_report(args),
        "groups_per_sequence": args.groups_per_sequence,
        "train_groups_seen": trainer.state.global_step * args.batch_size * args.groups_per_sequence,
        "distill_weight": args.distill_weight,
        "loss_weights": "lambda_j = 0.8**j",
        "train_seconds": round(train_s, 1),
        "last_logged_loss": round(float(history[-1]["loss"]), 4) if history else None,
        "last_logged_depth_losses": {k: v for k, v in history[-1].items() if k.startswith("loss_depth")}
        if history
        else None,
        "learning_curve": callbacks[0].curve if callbacks and hasattr(callbacks[0], "curve") else None,
        "command": command_line(args),
    }
