"""``hf-speculative train medusa``: Medusa-1 training on cached hidden states, then a calibrated tree and a
model card; ``--medusa2``: LoRA backbone + heads trained jointly (Medusa-2).

    hf-speculative train medusa --model reference --data examples/data/sharegpt_smollm2_distill.jsonl \\
        --out model_cards/medusa-smollm2-135m-instruct --num-heads 4 --epochs 2 --calibrate-nodes 32
"""

from __future__ import annotations

import sys
from pathlib import Path

from .common import (
    add_calibrated_training_args,
    add_conversation_training_args,
    add_labelled_args,
    command_line,
    curve_callbacks,
    draft_vocab_and_calibration,
    draft_vocab_source,
    final_train_loss,
    finish_folder,
    load_model_and_records,
    new_drafter,
    options,
    record_reference_base,
    set_frequent_draft_vocab,
    setup_torch,
    split_conversations,
    states_training_report,
    timed_training,
    training_args,
    training_states,
)


def add_parser(subparsers) -> None:
    """Register ``train medusa`` on ``subparsers`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser("medusa", help="Medusa-1 heads on a frozen backbone (hidden states cached once)")
    add_conversation_training_args(
        p,
        lr=1e-3,
        epochs=2.0,
        batch_size=None,
        batch_help="positions per step (default 64); with --medusa2 conversations per step (default 1)",
    )
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-layers", type=int, default=1, help="residual blocks per head")
    p.add_argument(
        "--own-lm-head", action="store_true", help="a trainable W2 per head (default: share the frozen base lm_head)"
    )
    add_calibrated_training_args(p, calibrate_nodes=32, saved="heads")
    add_labelled_args(p)
    m2 = p.add_argument_group("Medusa-2 (--medusa2: LoRA on the backbone + heads, trained jointly; a CHANGED model)")
    m2.add_argument(
        "--medusa2", action="store_true", help="joint training (Medusa 2.2.2); --lr is then the LoRA learning rate"
    )
    m2.add_argument("--init-heads", default=None, help="start from these trained Medusa-1 heads (heads warm-up)")
    m2.add_argument("--lora-r", type=int, default=8)
    m2.add_argument("--lora-alpha", type=int, default=16)
    m2.add_argument("--lora-dropout", type=float, default=0.0)
    m2.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj")
    m2.add_argument("--heads-lr-ratio", type=float, default=4.0, help="heads learning rate / LoRA learning rate")
    m2.add_argument("--lambda0", type=float, default=0.2, help="final weight of L_Medusa")
    m2.add_argument("--lambda0-schedule", default="sine", choices=["constant", "linear", "sine"])
    m2.add_argument(
        "--lambda0-warmup", type=float, default=0.3, help="share (<1) or number of steps of the lambda0 rise"
    )
    m2.add_argument(
        "--lm-loss", default="kl", choices=["ce", "kl", "ce+kl"], help="kl: self-distillation KL(p_original || p)"
    )
    m2.add_argument("--grad-accum", type=int, default=1)
    m2.add_argument(
        "--head-positions", type=int, default=None, help="L_Medusa on at most N random positions per batch (CPU cost)"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Medusa-1 (Sec. 2.2.1): heads on the frozen backbone's cached hidden states; ``--medusa2``: `run_medusa2`."""
    if getattr(args, "medusa2", False):
        return run_medusa2(args)
    args.batch_size = args.batch_size or 64
    setup_torch(args)
    from ..drafters.medusa.training_medusa import train_medusa
    from ..drafters.medusa.tree_calibration import MedusaCurveCallback, calibrate_tree, head_accuracies
    from ..model_card import write_drafter_card

    model, tokenizer, train_states, hold_states, counts = training_states(args)
    heads = _new_heads(model, args)
    callbacks = curve_callbacks(args, MedusaCurveCallback, heads, hold_states, 32, batch_size=args.batch_size)
    if args.draft_vocab_size and args.labelled:  # FR-Spec on the target's own greedy tokens; KD then trains in it
        set_frequent_draft_vocab(heads, draft_vocab_source(train_states), args.draft_vocab_size)
    trainer, train_s = timed_training(
        train_medusa, heads, train_states, args, max_positions=args.max_train_tokens, callbacks=callbacks
    )
    # FR-Spec on the most frequent answer tokens (with --labelled it was set before training, so KD ran in it)
    vocab_source = None if args.labelled else train_states.labels
    draft_vocab_and_calibration(
        heads, vocab_source, hold_states, args, calibrate_tree, head_accuracies, "head_top_i_accuracy"
    )
    heads.config.training = {
        "method": "medusa-1 (frozen backbone)" + (", KD on target-labelled shards" if args.labelled else ""),
        **states_training_report(args, counts, train_states, train_s, callbacks, trainer),
        "steps": trainer.state.global_step,
        "max_train_tokens": args.max_train_tokens,
        "final_loss": final_train_loss(trainer),
    }
    out = Path(args.out)
    return finish_folder(out, heads.save_pretrained, lambda o: write_drafter_card(heads, o), heads.config.training)


def _new_heads(model, args):
    """Fresh Medusa heads on ``model`` from the command line, the reference model recorded as their base."""
    from ..drafters.medusa.modeling_medusa import MedusaHeadsModel

    settings = options(args, "num_heads", "num_layers", "acceptance")
    return new_drafter(MedusaHeadsModel, model, args, share_lm_head=not args.own_lm_head, **settings)


def _medusa2_heads(model, args):
    """The Medusa heads to train jointly: warm-started from ``--init-heads`` (stage 1) or fresh on ``model``."""
    from ..drafters.medusa.modeling_medusa import MedusaHeadsModel

    if not args.init_heads:
        return _new_heads(model, args)
    # heads warm-up, stage 1: trained Medusa-1 heads
    heads = MedusaHeadsModel.from_pretrained(args.init_heads, base_model=model).to(model.device)
    record_reference_base(heads.config, args.model)
    return heads


def _medusa2_evaluation(args, run, tokenizer, hold_set, held_out) -> dict:
    """Held-out LM loss with and without the adapter and, with ``--calibrate-nodes``, a tree calibrated on the
    adapted model's hidden states (into ``heads.config``)."""
    from ..drafters.medusa.training_medusa2 import calibrate_adapted_tree, evaluate_lm_loss

    evaluation = {
        "held_out_lm_loss_base": round(evaluate_lm_loss(run.peft_model, hold_set, adapter=False), 4),
        "held_out_lm_loss_adapted": round(evaluate_lm_loss(run.peft_model, hold_set, adapter=True), 4),
    }
    print(f"held-out LM loss: {evaluation}", file=sys.stderr)
    if args.calibrate_nodes:
        tree = calibrate_adapted_tree(
            run, tokenizer, held_out, max_length=args.max_length, num_nodes=args.calibrate_nodes, progress=True
        )
        print(
            f"calibrated tree (adapted model's hidden states): {tree.num_nodes} nodes, depth {tree.depth}; "
            f"expected tau {run.joint.heads.config.calibration['expected_acceptance_length']}",
            file=sys.stderr,
        )
    return evaluation


def _medusa2_training_report(args, heads, train_records, held_out, run, targets, evaluation) -> dict:
    """``heads.config.training`` of a Medusa-2 run."""
    from ..training.distributed import num_processes

    train_set, history, steps = run.dataset, run.trainer.state.log_history, run.trainer.state.global_step
    return {
        "method": "medusa-2 (LoRA backbone + heads, joint)",
        "base": f"{heads.config.base_model_name_or_path} + LoRA adapter (adapter/): a CHANGED model",
        "data": str(args.data),
        "conversations": len(train_records),
        "held_out_conversations": len(held_out),
        "holdout": args.holdout,
        "seed": args.seed,
        "limit": args.limit,
        "train_conversations_used": len(train_set),
        "train_answer_tokens": train_set.num_answer_tokens,
        "optimizer_steps": steps,
        "conversations_seen": steps * args.batch_size * args.grad_accum,
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "max_length": args.max_length,
        "lora": {"r": args.lora_r, "alpha": args.lora_alpha, "dropout": args.lora_dropout, "target_modules": targets},
        "learning_rate_lora": args.lr,
        "learning_rate_heads": args.lr * args.heads_lr_ratio,
        "lambda0": args.lambda0,
        "lambda0_schedule": {"kind": args.lambda0_schedule, "warmup": args.lambda0_warmup},
        "lm_loss": args.lm_loss,
        "max_head_positions": args.head_positions,
        "time_budget_s": args.time_budget,
        "init_heads": args.init_heads,
        "batch_size": args.batch_size,
        "processes": num_processes(),  # data-parallel: the batch size is per process
        "gradient_accumulation_steps": args.grad_accum,
        "train_seconds": round(run.seconds, 1),
        "final_loss": final_train_loss(run.trainer),
        "log": [
            {k: v for k, v in h.items() if k.startswith("loss") or k in ("step", "lambda0")}
            for h in history
            if "loss" in h
        ],
        **evaluation,
        "command": command_line(args),
    }


def run_medusa2(args) -> int:
    """Medusa-2 (Sec. 2.2.2): LoRA backbone + heads trained jointly (`fit_medusa2`); saves heads + ``adapter/`` + card."""
    args.batch_size = args.batch_size or 1
    setup_torch(args)
    from ..drafters.medusa.training_medusa2 import Lambda0Schedule, Medusa2Dataset, fit_medusa2, save_medusa2
    from ..model_card import write_drafter_card

    model, tokenizer, records = load_model_and_records(args)
    train_records, held_out = split_conversations(records, args)
    heads = _medusa2_heads(model, args)
    targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
    lora = options(args, "lora_r", "lora_alpha", "lora_dropout")
    settings = options(args, "max_length", "heads_lr_ratio", "lm_loss")
    schedule = Lambda0Schedule(args.lambda0, args.lambda0_warmup, args.lambda0_schedule)
    run = fit_medusa2(
        model,
        heads,
        tokenizer,
        train_records,
        lora_targets=targets,
        gradient_accumulation_steps=args.grad_accum,
        schedule=schedule,
        max_head_positions=args.head_positions,
        **lora,
        **settings,
        **training_args(args),
    )
    print(f"train: {len(run.dataset)} conversations, {run.dataset.num_answer_tokens} answer tokens", file=sys.stderr)
    hold_set = Medusa2Dataset(tokenizer, held_out, max_length=args.max_length) if held_out else None
    evaluation = (
        _medusa2_evaluation(args, run, tokenizer, hold_set, held_out) if hold_set is not None and len(hold_set) else {}
    )
    heads.config.training = _medusa2_training_report(args, heads, train_records, held_out, run, targets, evaluation)
    report = {k: v for k, v in heads.config.training.items() if k != "log"}
    return finish_folder(
        Path(args.out), lambda o: save_medusa2(run.joint, o), lambda o: write_drafter_card(heads, o), report
    )
