"""``hf-speculative train streaming``: Speculative Streaming, then a calibrated tree (and, lossless, a model card).

Lossless mode (default): the streams alone, on the states entering the MSA layers, computed once and cached.
Shared mode (``--mode shared``): the streams and LoRA adapters on the base (PEFT), with the joint forward
through the whole model on token segments, alpha_0 = 1, alpha_j = 0.1 (Sec. 3.1.4, H.1).

    hf-speculative train streaming --model reference --data examples/data/sharegpt_smollm2_distill.jsonl \\
        --out model_cards/speculative-streaming-smollm2-135m-instruct --num-streams 3 --num-msa-layers 4
    hf-speculative train streaming --mode shared --lora-rank 8 --model reference --data ... --out ...
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .common import (
    add_calibrate_nodes_arg,
    add_conversation_training_args,
    add_curve_points_arg,
    add_labelled_args,
    draft_vocab_source,
    final_train_loss,
    finish_folder,
    labelled_training_states,
    load_model_and_records,
    loss_curve,
    new_drafter,
    options,
    set_frequent_draft_vocab,
    setup_torch,
    split_conversations,
    states_training_report,
    timed_training,
)

#: the options that take one of the config's CHOICES (the first the default; a test checks they agree), with their help
CHOICE_ARGS = {
    "mode": (("lossless", "shared"), "lossless: streams only; shared: Eq. 1 + LoRA on the base"),
    "stream_embedding_init": (
        ("random", "token_embeddings"),
        "P_j random (std 0.02), or the target's mean token embedding at the residual stream's scale",
    ),
}


def add_parser(subparsers) -> None:
    """Register ``train streaming`` on ``methods`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser(
        "streaming",
        help="Speculative Streaming: lossless (frozen base, MSA-layer inputs cached) or shared (LoRA base + streams, joint forward)",
    )
    add_segment_training_args(p, lr=2e-3, batch_size=2)
    for name, (choices, help_text) in CHOICE_ARGS.items():
        p.add_argument(f"--{name.replace('_', '-')}", choices=choices, default=choices[0], help=help_text)
    p.add_argument("--lora-rank", type=int, default=8, help="shared mode: rank of the PEFT LoRA adapters on the base")
    p.add_argument("--lora-alpha", type=float, default=16.0, help="shared mode: LoRA alpha")
    p.add_argument("--num-streams", type=int, default=3, help="gamma")
    p.add_argument("--num-msa-layers", type=int, default=4, help="N_s")
    p.add_argument("--adapter-rank", type=int, default=8, help="rank of the stream-row adapters on the MSA layers")
    p.add_argument("--stream-init-rank", type=int, default=0, help="eta (0: identity stream init)")
    p.add_argument("--top-k", type=int, default=2, help="top-k per stream of the default (uncalibrated) tree")
    add_calibrate_nodes_arg(p, 16)
    add_curve_points_arg(p)
    p.add_argument(
        "--curve-conversations", type=int, default=10, help="held-out conversations used for the curve points"
    )
    p.add_argument(
        "--extract-only",
        action="store_true",
        help="only compute (and cache) the states entering the MSA layers (lossless)",
    )
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="FR-Spec: the streams draft on the K most frequent answer tokens of the training data (default: full vocabulary)",
    )
    add_labelled_args(p)
    p.set_defaults(func=run)


def add_segment_training_args(p, lr: float, batch_size: int, max_train_tokens: bool = True) -> None:
    """The arguments both streaming commands share (`add_conversation_training_args`, segments of conversations,
    one held-out split)."""
    add_conversation_training_args(
        p, lr=lr, batch_size=batch_size, batch_help="segments per step", max_train_tokens=max_train_tokens
    )
    p.add_argument("--segment-length", type=int, default=256)
    p.add_argument("--max-length", type=int, default=1024, help="tokens per conversation")
    p.add_argument("--limit", type=int, default=None, help="use the first N conversations")
    p.add_argument("--holdout", type=float, default=0.1)


def _training_method(args, shared: bool) -> str:
    """The ``training.method`` line of the drafter's config."""
    return (
        f"speculative streaming, shared mode (LoRA rank {args.lora_rank} on the base, alpha_0 = 1, alpha_j = 0.1)"
        if shared
        else "speculative streaming, lossless mode (frozen base, alpha_0 = 0)"
    ) + (", KD on target-labelled shards" if args.labelled else "")


def _training_report(
    args, ss, model, train_states, trainer, train_s: float, counts: dict, callbacks: list, shared: bool
) -> dict:
    """``ss.config.training``: data, settings, steps, loss, parameter counts and the learning curve."""
    base_params = sum(p.numel() for p in model.parameters())
    return {
        "method": _training_method(args, shared),
        **states_training_report(args, counts, train_states, train_s, callbacks, trainer),
        "steps_done": trainer.state.global_step,
        "time_budget_s": args.time_budget,
        "segment_length": args.segment_length,
        "final_loss": final_train_loss(trainer),
        "loss_curve": loss_curve(trainer),
        "stream_parameters": ss.num_stream_parameters(),
        "lora_parameters": sum(p.numel() for p in ss.trainable_parameters()) - ss.num_stream_parameters()
        if shared
        else 0,
        "base_parameters": base_params,
        "extra_parameter_share": round(ss.num_stream_parameters() / base_params, 6),
    }


def _build_streams(model, args):
    """The Speculative Streaming drafter on ``model``, configured from the command line."""
    from ..drafters.streaming.modeling_speculative_streaming import LlamaForSpeculativeStreaming

    streams = options(
        args, "num_streams", "num_msa_layers", "mode", "adapter_rank", "stream_init_rank", "stream_embedding_init"
    )
    lora = options(args, "lora_rank", "lora_alpha")
    return new_drafter(LlamaForSpeculativeStreaming, model, args, tree_top_k=args.top_k, **streams, **lora)


def run(args) -> int:
    setup_torch(args)
    from ..drafters.streaming.training_speculative_streaming import calibrate_stream_tree, train_speculative_streaming

    shared = args.mode == "shared"
    model, ss, train_states, hold_states, counts = _streams_and_states(args, shared)
    if args.extract_only:
        return 0
    callbacks = _curve_callbacks(args, ss, hold_states)
    trainer, train_s = timed_training(
        train_speculative_streaming,
        ss,
        train_states,
        args,
        segment_length=args.segment_length,
        max_tokens=args.max_train_tokens,
        callbacks=callbacks,
    )
    if args.draft_vocab_size:  # FR-Spec: the streams draft on the most frequent answer tokens of the training data
        set_frequent_draft_vocab(ss, draft_vocab_source(train_states), args.draft_vocab_size)
    if hold_states is not None:  # held-out accuracies; with --calibrate-nodes the calibrated tree replaces the default
        calibrate_stream_tree(ss, hold_states, args.calibrate_nodes)
    ss.config.training = _training_report(args, ss, model, train_states, trainer, train_s, counts, callbacks, shared)
    return _save(args, ss, shared)


def _streams_and_states(args, shared: bool):
    """(target, drafter, train states, held-out states, counts): the Speculative Streaming drafter on the target,
    and what it trains on: the ``--labelled`` shards, or ``--data``'s conversations split into train and held out,
    tokenized (shared mode) or as the states entering the first MSA layer (lossless, cached)."""
    from ..training.distributed import main_process_first

    if args.labelled:  # the shards hold the states entering the first MSA layer and the target's top-k
        if shared:
            raise SystemExit(
                "--labelled trains lossless mode (cached states entering the MSA layers); shared mode needs --data"
            )
        from ..training.labelling import LabelledShards

        layer = LabelledShards(args.labelled[0]).manifest["num_hidden_layers"] - args.num_msa_layers
        model, tokenizer, train_states, hold_states, counts = labelled_training_states(args, layer=layer)
    else:
        model, tokenizer, records = load_model_and_records(args)
        train_records, held_out = split_conversations(records, args)
        counts = {"conversations": len(train_records), "held_out_conversations": len(held_out)}
    ss = _build_streams(model, args)
    layer = ss.config.first_msa_layer
    t0 = time.perf_counter()
    if not args.labelled:
        with main_process_first():  # several processes: the main one fills the state cache, the others read it
            train_states = _prepare_states(args, shared, model, tokenizer, train_records, layer)
            hold_states = _prepare_states(args, shared, model, tokenizer, held_out, layer) if held_out else None
    what = "tokens" if shared else f"states entering layer {layer}"
    print(f"{what}: {train_states.num_train_tokens} answer tokens ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    return model, ss, train_states, hold_states, counts


def _prepare_states(args, shared: bool, model, tokenizer, records, layer: int):
    """Shared mode: the tokenized conversations (the joint forward runs the whole LoRA-adapted model every step);
    lossless: the states entering decoder layer ``layer``."""
    from ..drafters.streaming.training_speculative_streaming import extract_stream_inputs, tokenize_records

    if shared:
        return tokenize_records(tokenizer, records, max_length=args.max_length)
    return extract_stream_inputs(model, tokenizer, records, layer, max_length=args.max_length)


def _curve_callbacks(args, ss, hold_states) -> list:
    """With held-out states and ``--curve-points``: the callback that records the learning curve on the first
    ``--curve-conversations`` held-out conversations; else none."""
    if hold_states is None or not args.curve_points:
        return []
    from ..drafters.streaming.training_speculative_streaming import StreamCurveCallback

    curve_states = hold_states.select(range(min(len(hold_states), args.curve_conversations)))
    return [
        StreamCurveCallback(
            ss, curve_states, args.calibrate_nodes or 16, args.curve_points, args.batch_size * args.segment_length
        )
    ]


def _save(args, ss, shared: bool) -> int:
    """Save the drafter to ``--out`` with its model card (lossless mode only: the card describes that mode)."""
    from ..model_card import write_drafter_card

    out = Path(args.out)
    if shared:
        print(
            "shared mode: config, streams and lora/ saved; the model card template describes lossless mode, none written",
            file=sys.stderr,
        )
    report = {"training": ss.config.training, "calibration": getattr(ss.config, "calibration", None)}
    return finish_folder(out, ss.save_pretrained, None if shared else (lambda o: write_drafter_card(ss, o)), report)
