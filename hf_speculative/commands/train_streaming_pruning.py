"""``hf-speculative train streaming-pruning``: add a trained parallel-tree-pruning early exit (Speculative
Streaming Sec. 3.1.3) to trained streams."""

from __future__ import annotations

from .common import command_line, finish_folder, load_model_and_records, setup_torch, split_records, training_args
from .train_streaming import add_segment_training_args


def add_parser(subparsers) -> None:
    """Register ``train streaming-pruning`` on ``methods`` (the ``train`` sub-parsers)."""
    p = subparsers.add_parser(
        "streaming-pruning", help="add a parallel-tree-pruning early exit (Sec. 3.1.3) to trained streams"
    )
    p.add_argument("--streams", required=True, help="trained Speculative Streaming folder")
    add_segment_training_args(p, lr=1e-3, batch_size=4, max_train_tokens=False)
    p.add_argument("--pruning-layer", type=int, required=True, help="l: the early exit reads the state after l layers")
    p.add_argument("--pruning-rank", type=int, default=8, help="theta")
    p.add_argument(
        "--threshold", type=float, default=0.01, help="pruning threshold on the estimated transition probability"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    """Add a trained parallel-tree-pruning head (Sec. 3.1.3) to trained streams: the base's states entering layer
    l cached once, the rank-theta early-exit adapter trained with next-token CE, held-out top-1 reported."""
    setup_torch(args)
    from ..drafters.streaming.modeling_speculative_streaming import LlamaForSpeculativeStreaming
    from ..drafters.streaming.training_pruning import fit_pruning_head
    from ..model_card import write_drafter_card

    model, tokenizer, records = load_model_and_records(args)
    ss = LlamaForSpeculativeStreaming.from_pretrained(args.streams, base_model=model)
    ss.add_pruning_head(args.pruning_layer, rank=args.pruning_rank, threshold=args.threshold)
    train_records, held_out = split_records(records, args.holdout, args.seed)
    record = fit_pruning_head(
        ss,
        tokenizer,
        train_records,
        held_out,
        max_length=args.max_length,
        segment_length=args.segment_length,
        **training_args(args),
    )
    ss.config.pruning = {
        "method": "parallel tree pruning (Sec. 3.1.3): early exit after layer l, rank-theta adapter, next-token CE",
        "data": str(args.data),
        **record,
        "command": command_line(args),
    }
    return finish_folder(args.out, ss.save_pretrained, lambda o: write_drafter_card(ss, o), ss.config.pruning)
