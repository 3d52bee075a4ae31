"""``hf-speculative train medusa`` and ``hf-speculative calibrate-tree``: Medusa-1 training on cached hidden
states, then a calibrated tree and a model card.

    hf-speculative train medusa --model reference --data examples/data/sharegpt_smollm2_distill.jsonl \\
        --out model_cards/medusa-smollm2-135m-instruct --num-heads 4 --epochs 2 --calibrate-nodes 32
    hf-speculative calibrate-tree --heads DIR --model reference --data held_out.jsonl --num-nodes 32
"""

from __future__ import annotations

import json
import random
import shlex
import sys
import time
from pathlib import Path

__all__ = ["add_medusa_parsers", "split_records", "cmd_train_medusa", "cmd_calibrate_tree"]


def split_records(records, holdout: float, seed: int = 0):
    """(train, held-out) split of the records, by record (seeded shuffle)."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_hold = int(round(holdout * len(records)))
    hold = sorted(order[:n_hold])
    train = sorted(order[n_hold:])
    return [records[i] for i in train], [records[i] for i in hold]


def _load(args):
    from ...bench.reference import resolve_model
    from ...cli import _dtype
    from ...training.data import load_records

    records = [r for r in load_records(args.data) if r.answers]
    if args.limit:
        records = records[: args.limit]
    model, tokenizer = resolve_model(args.model, dtype=_dtype(args.dtype), device=args.device)
    return model, tokenizer, records


def cmd_train_medusa(args, setup_torch) -> int:
    setup_torch(args)
    import torch

    from ...training.trainer import extract_hidden_states
    from .model_card import write_model_card
    from .modeling_medusa import MedusaHeadsModel
    from .training_medusa import train_medusa
    from .tree_calibration import calibrate_tree, head_accuracies

    model, tokenizer, records = _load(args)
    train_records, held_out = split_records(records, args.holdout, args.seed)
    print(f"{len(records)} conversations: {len(train_records)} train, {len(held_out)} held out", file=sys.stderr)
    t0 = time.perf_counter()
    train_states = extract_hidden_states(model, tokenizer, train_records, max_length=args.max_length)
    hold_states = extract_hidden_states(model, tokenizer, held_out, max_length=args.max_length) if held_out else None
    print(f"hidden states: {train_states.num_train_tokens} answer tokens ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)

    heads = MedusaHeadsModel.from_base_model(
        model, num_heads=args.num_heads, num_layers=args.num_layers, share_lm_head=not args.own_lm_head, acceptance=args.acceptance
    )
    if args.model in ("reference", "smollm2", "smollm2-135m-instruct"):
        heads.config.base_model_name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    callbacks = []
    if hold_states is not None and args.curve_points:
        from .training_medusa import MedusaCurveCallback

        curve = MedusaCurveCallback(
            heads, hold_states, num_nodes=args.calibrate_nodes or 32, num_points=args.curve_points,
            save_dir=args.curve_checkpoints, batch_size=args.batch_size,
        )  # fmt: skip
        callbacks.append(curve)
    t0 = time.perf_counter()
    trainer = train_medusa(
        heads,
        train_states,
        output_dir=str(Path(args.out) / "trainer_state"),
        num_epochs=args.epochs,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        max_positions=args.max_train_tokens,
        seed=args.seed,
        callbacks=callbacks,
    )
    train_s = time.perf_counter() - t0
    if hold_states is not None and args.calibrate_nodes:
        tree = calibrate_tree(heads, hold_states, num_nodes=args.calibrate_nodes)
        print(f"calibrated tree: {tree.num_nodes} nodes, depth {tree.depth}; "
              f"expected tau {heads.config.calibration['expected_acceptance_length']}", file=sys.stderr)  # fmt: skip
    elif hold_states is not None:
        heads.config.calibration = {"head_top_i_accuracy": [[round(a, 4) for a in r] for r in head_accuracies(heads, hold_states)]}
    heads.config.training = {
        "method": "medusa-1 (frozen backbone)",
        "data": str(args.data),
        "conversations": len(train_records),
        "held_out_conversations": len(held_out),
        "train_answer_tokens": train_states.num_train_tokens,
        "epochs": args.epochs,
        "learning_rate": args.lr,
        "batch_size": args.batch_size,
        "max_train_tokens": args.max_train_tokens,
        "train_seconds": round(train_s, 1),
        "final_loss": round(float(trainer.state.log_history[-1].get("train_loss", float("nan"))), 4),
        "learning_curve": callbacks[0].curve if callbacks else None,
        "command": "hf-speculative " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[0].endswith("hf-speculative") else None,
    }
    out = Path(args.out)
    heads.save_pretrained(out)
    write_model_card(heads, out)
    import shutil

    shutil.rmtree(out / "trainer_state", ignore_errors=True)
    print(json.dumps(heads.config.training, indent=1))
    return 0


def cmd_calibrate_tree(args, setup_torch) -> int:
    setup_torch(args)
    from ...training.trainer import extract_hidden_states
    from .model_card import write_model_card
    from .modeling_medusa import MedusaHeadsModel
    from .tree_calibration import calibrate_tree

    model, tokenizer, records = _load(args)
    heads = MedusaHeadsModel.from_pretrained(args.heads, base_model=model).to(model.device)
    if args.holdout < 1.0:
        _, records = split_records(records, args.holdout, args.seed)
    states = extract_hidden_states(model, tokenizer, records, max_length=args.max_length)
    tree = calibrate_tree(heads, states, num_nodes=args.num_nodes)
    out = Path(args.out or args.heads)
    heads.save_pretrained(out)
    if (out / "README.md").exists() or args.out:
        write_model_card(heads, out)
    print(json.dumps({"medusa_choices": tree.to_list(), **heads.config.calibration}))
    return 0


def add_medusa_parsers(sub, methods, add_common, setup_torch) -> None:
    """Register ``train medusa`` (on ``methods``, the ``train`` sub-parsers) and ``calibrate-tree`` (on ``sub``)."""
    p = methods.add_parser("medusa", help="Medusa-1 heads on a frozen backbone (hidden states cached once)")
    add_common(p)
    p.add_argument("--data", required=True, help="training conversations (chat jsonl, ShareGPT, ...: hf_speculative.training.data)")
    p.add_argument("--out", required=True, help="output folder (config.json, model.safetensors, README.md)")
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-layers", type=int, default=1, help="residual blocks per head")
    p.add_argument("--own-lm-head", action="store_true", help="a trainable W2 per head (default: share the frozen base lm_head)")
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64, help="positions per step")
    p.add_argument("--max-length", type=int, default=1024, help="tokens per conversation")
    p.add_argument("--max-train-tokens", type=int, default=None, help="train on at most this many positions")
    p.add_argument("--limit", type=int, default=None, help="use the first N conversations")
    p.add_argument("--holdout", type=float, default=0.1, help="share of conversations held out for tree calibration")
    p.add_argument("--calibrate-nodes", type=int, default=32, help="node budget of the calibrated tree (0: keep the default)")
    p.add_argument("--acceptance", default="exact", choices=["exact", "typical"])
    p.add_argument("--curve-points", type=int, default=0, help="record held-out accuracy / expected tau at N points of training")
    p.add_argument("--curve-checkpoints", default=None, help="also save the heads at those points in this folder")
    p.set_defaults(func=lambda a: cmd_train_medusa(a, setup_torch))

    c = sub.add_parser("calibrate-tree", help="Medusa 2.3.3: a tree from the heads' measured top-i accuracies")
    add_common(c)
    c.add_argument("--heads", required=True, help="Medusa heads folder")
    c.add_argument("--data", required=True, help="calibration conversations")
    c.add_argument("--num-nodes", type=int, default=32)
    c.add_argument("--holdout", type=float, default=1.0, help="use only this held-out share of --data (same split as training)")
    c.add_argument("--max-length", type=int, default=1024)
    c.add_argument("--limit", type=int, default=None)
    c.add_argument("--out", default=None, help="output folder (default: update --heads in place)")
    c.set_defaults(func=lambda a: cmd_calibrate_tree(a, setup_torch))
