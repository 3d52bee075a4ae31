"""``hf-speculative calibrate-tree``: Medusa 2.3.3, a tree from the heads' measured top-i accuracies.

hf-speculative calibrate-tree --heads DIR --model reference --data held_out.jsonl --num-nodes 32
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import add_model_args, load_model_and_records, setup_torch, split_records


def add_parser(subparsers) -> None:
    c = subparsers.add_parser("calibrate-tree", help="Medusa 2.3.3: a tree from the heads' measured top-i accuracies")
    add_model_args(c)
    c.add_argument("--heads", required=True, help="Medusa heads folder")
    c.add_argument(
        "--data", default="sharegpt-heldout", help="calibration conversations (default: the held-out tail of ShareGPT)"
    )
    c.add_argument("--num-nodes", type=int, default=32)
    c.add_argument(
        "--holdout", type=float, default=1.0, help="use only this held-out share of --data (same split as training)"
    )
    c.add_argument("--max-length", type=int, default=1024)
    c.add_argument("--limit", type=int, default=None)
    c.add_argument("--out", default=None, help="output folder (default: update --heads in place)")
    c.set_defaults(func=run)


def run(args) -> int:
    from ..training.distributed import is_main_process, main_process_first

    setup_torch(args)
    from ..drafters.medusa.modeling_medusa import MedusaHeadsModel
    from ..drafters.medusa.tree_calibration import calibrate_tree
    from ..model_card import write_drafter_card
    from ..training.trainer import extract_hidden_states

    model, tokenizer, records = load_model_and_records(args)
    heads = MedusaHeadsModel.from_pretrained(args.heads, base_model=model).to(model.device)
    if args.holdout < 1.0:
        _, records = split_records(records, args.holdout, args.seed)
    with main_process_first():
        states = extract_hidden_states(model, tokenizer, records, max_length=args.max_length)
    tree = calibrate_tree(heads, states, num_nodes=args.num_nodes)
    out = Path(args.out or args.heads)
    if is_main_process():  # calibration is deterministic: every process built the same tree
        heads.save_pretrained(out)
        if (out / "README.md").exists() or args.out:
            write_drafter_card(heads, out)
        print(json.dumps({"medusa_choices": tree.to_list(), **heads.config.calibration}))
    return 0
