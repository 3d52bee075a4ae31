"""``hf-speculative train eagle``: an EAGLE-1/2 or EAGLE-3 drafter on target-labelled shards (``hf-speculative label``).

    hf-speculative train eagle --model reference --variant eagle3 \\
        --labelled ~/.cache/hf_speculative/labelled/smollm2-sharegpt --out model_cards/eagle-smollm2-135m-instruct \\
        --draft-vocab-size 8192 --max-train-tokens 400000 --time-budget 1200 --threads 1
"""

from __future__ import annotations

import time

from .common import add_model_args, command_line, finish_folder, parse_dtype, record_reference_base, setup_torch


def add_parser(subparsers) -> None:
    """Register ``train eagle`` on ``subparsers`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser("eagle", help="EAGLE-1/2/3 drafter on the target's cached features (labelled shards)")
    add_model_args(p)
    p.add_argument("--variant", default="eagle3", choices=["eagle1", "eagle2", "eagle3"])
    p.add_argument("--labelled", action="append", required=True, help="target-labelled shard folder(s) (hf-speculative label)")
    p.add_argument("--labelled-holdout", type=int, default=40, help="the last N conversations of each folder are not trained on")
    p.add_argument("--out", required=True, help="output folder (config.json, model.safetensors, README.md)")
    p.add_argument("--draft-vocab-size", type=int, default=8192, help="EAGLE-3: the draft vocabulary (most frequent tokens)")
    p.add_argument("--ttt-steps", type=int, default=None, help="unrolled training-time-test steps (default: 4 for EAGLE-3, 1 for EAGLE-1/2)")
    p.add_argument("--max-train-tokens", type=int, default=None, help="train on at most this many labelled tokens")
    p.add_argument("--max-length", type=int, default=512, help="tokens per training chunk")
    p.add_argument("--batch-size", type=int, default=4, help="chunks per step")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--feature-noise", type=float, default=0.0, help="EAGLE Sec. 4.3 uniform feature noise half width")
    p.add_argument("--time-budget", type=float, default=None, help="stop training after this many seconds")
    p.add_argument("--save-dtype", default="bfloat16", help="dtype of the saved weights (default bfloat16)")
    p.add_argument("--total-tokens", type=int, default=24, help="dynamic tree: nodes kept per step")
    p.add_argument("--tree-depth", type=int, default=5)
    p.add_argument("--tree-top-k", type=int, default=4)
    p.set_defaults(func=run)


def run(args) -> int:
    setup_torch(args)
    from ..bench.reference import resolve_model
    from ..drafters.draft_vocab import frequent_tokens
    from ..model_card import write_drafter_card
    from ..drafters.eagle.modeling_eagle import EagleDrafter
    from ..drafters.eagle.training_eagle import train_eagle
    from ..training.labelling import LabelledShards
    from ..training.trainer import HiddenStates

    model, _ = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    for p in model.parameters():
        p.requires_grad_(False)
    drafter = EagleDrafter.from_base_model(
        model, variant=args.variant, draft_vocab_size=args.draft_vocab_size if args.variant == "eagle3" else None,
        total_tokens=args.total_tokens, tree_depth=args.tree_depth, tree_top_k=args.tree_top_k, feature_noise=args.feature_noise,
    )  # fmt: skip
    record_reference_base(drafter.config, args.model)
    L = model.config.num_hidden_layers
    layers = drafter.config.feature_layers(L)
    extra = [i for i in layers if i != L]
    parts = []
    budget = args.max_train_tokens
    for folder in args.labelled:
        shards = LabelledShards(folder)
        train_idx, _ = shards.split(args.labelled_holdout)
        per_folder = None if budget is None else budget // len(args.labelled)
        parts.append(shards.to_hidden_states(extra_layers=extra, conversations=train_idx, max_tokens=per_folder))
    states = HiddenStates.concat(parts)
    print(f"labelled: {len(states)} conversations, {int(states.input_ids.numel())} tokens; feature layers {layers}")
    if drafter.config.is_eagle3:  # EAGLE-3's draft vocabulary: the most frequent tokens the target produces
        drafter.set_draft_vocab(frequent_tokens(states.topk_ids[:, 0].long(), args.draft_vocab_size, model.config.vocab_size))
    start = time.perf_counter()
    trainer = train_eagle(
        drafter, states, output_dir=str(args.out) + "/trainer_state", steps=args.ttt_steps, num_epochs=args.epochs,
        max_steps=args.max_steps, batch_size=args.batch_size, max_length=args.max_length, learning_rate=args.lr,
        time_budget=args.time_budget, final_layer=L, seed=args.seed,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "loss" in h]
    drafter.config.training = {
        "method": f"{args.variant} on target-labelled shards (KD on the target's top-k"
        + (", training-time test" if drafter.config.is_eagle3 else ", feature regression") + ")",
        "data": ", ".join(args.labelled),
        "conversations": len(states),
        "tokens": int(states.input_ids.numel()),
        "steps": trainer.state.global_step,
        "batch": f"{args.batch_size} x {args.max_length} tokens",
        "learning_rate": args.lr,
        "train_seconds": round(seconds, 1),
        "first_logged": {k: v for k, v in logs[0].items() if k != "epoch"} if logs else None,
        "last_logged": {k: v for k, v in logs[-1].items() if k != "epoch"} if logs else None,
        "command": command_line(args),
    }
    out = args.out
    save_dtype = parse_dtype(args.save_dtype)

    def save(folder):
        drafter.to(save_dtype).save_pretrained(folder)

    return finish_folder(out, save, lambda o: write_drafter_card(drafter, o), drafter.config.training)
