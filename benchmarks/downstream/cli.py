"""``python benchmarks/run_downstream.py train|prune|eval|table``: task fine-tuning with speculative decoding
(Speculative Streaming, Sec. 4.1, Table 1) on E2E NLG, WikiSQL and DialogSum (`downstream`).

    python benchmarks/run_downstream.py train --task e2e_nlg --method streaming --data ../shared/data/e2e_nlg \\
        --out model_cards/speculative-streaming-smollm2-135m-e2e-nlg --time-budget 600
    python benchmarks/run_downstream.py train --task e2e_nlg --method eagle --adapter model_cards/lora-smollm2-135m-e2e-nlg ...
    python benchmarks/run_downstream.py prune model_cards/speculative-streaming-smollm2-135m-e2e-nlg \\
        --data ../shared/data/e2e_nlg --pruning-layer 8 --pruning-threshold 0.01
    python benchmarks/run_downstream.py eval model_cards/speculative-streaming-smollm2-135m-e2e-nlg --task e2e_nlg \\
        --data ../shared/data/e2e_nlg --limit 50 --threads 2 --output results/downstream/e2e_streaming.json
    python benchmarks/run_downstream.py table --results results/downstream --output docs/downstream_table.md \\
        --plot docs/downstream.png
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from hf_speculative.bench.report import beside_record, write_json
from hf_speculative.commands.common import setup_torch

from .drafter_names import TRAINING_FREE

PROGRAM = "python benchmarks/run_downstream.py"
TASKS = ("e2e_nlg", "wikisql", "dialogsum")
METHODS = ("lora", "medusa2", "streaming", "eagle", "medusa")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROGRAM,
        description="task fine-tuning arms (LoRA, Medusa-2, Speculative Streaming, "
        "EAGLE-3, Medusa heads) of Speculative Streaming's Table 1: train, prune, calibrate, eval, table",
    )
    sub = p.add_subparsers(dest="downstream_command", required=True)
    _add_train_parser(sub)
    _add_prune_parser(sub)
    _add_calibrate_parser(sub)
    _add_eval_parser(sub)
    _add_compare_parser(sub)
    _add_table_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    from hf_speculative.auto import register_auto_classes

    register_auto_classes()
    status = args.func(args) or 0
    from hf_speculative.training.distributed import end_processes

    end_processes()  # under accelerate launch: no process exits while another still writes the folder
    return status


def command_line(args) -> str:
    """The command as typed, recorded in a folder's ``downstream.json`` and each eval JSON."""
    return f"{PROGRAM} " + " ".join(shlex.quote(a) for a in args.argv)


def _add_train_parser(sub) -> None:
    """Register ``downstream train``."""
    t = sub.add_parser("train", help="fine-tune one arm on one task; writes a folder that 'downstream eval' loads")
    t.add_argument("--task", required=True, choices=TASKS)
    t.add_argument("--method", required=True, choices=METHODS)
    t.add_argument("--data", required=True, help="the task's data folder (e.g. ../shared/data/e2e_nlg)")
    t.add_argument("--out", required=True, help="output folder (adapter / streams / heads / drafter + downstream.json)")
    t.add_argument("--model", default="reference", help="base model: 'reference' (default), a local folder or a Hub id")
    t.add_argument(
        "--adapter",
        default=None,
        help="--method eagle / medusa: the folder of a 'lora' run whose model the drafter drafts for",
    )
    t.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="stop training after this many seconds (all resumed runs together)",
    )
    t.add_argument("--max-steps", type=int, default=-1, help="stop after N optimizer steps (default: --epochs)")
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--batch-size", type=int, default=16, help="examples per optimizer step")
    t.add_argument("--lr", type=float, default=1e-3, help="learning rate (LoRA, streams; Medusa heads x4)")
    t.add_argument("--lora-rank", type=int, default=8)
    t.add_argument("--lora-alpha", type=float, default=16.0)
    t.add_argument("--max-length", type=int, default=None, help="tokens per training example (default: the task's)")
    t.add_argument("--limit", type=int, default=None, help="train on the first N pairs only (smoke runs)")
    t.add_argument(
        "--calibration-prompts", type=int, default=48, help="training prompts set aside to calibrate the tree"
    )
    t.add_argument("--tree-nodes", type=int, default=16, help="node budget of the calibrated tree (streaming, medusa2)")
    t.add_argument("--num-streams", type=int, default=3, help="streaming: gamma")
    t.add_argument("--num-msa-layers", type=int, default=4, help="streaming: N_s")
    t.add_argument("--num-heads", type=int, default=4, help="medusa2, medusa: heads")
    t.add_argument("--eagle-max-tokens", type=int, default=400_000, help="eagle, medusa: labelled training tokens")
    t.add_argument(
        "--eagle-draft-vocab",
        type=int,
        default=8192,
        help="eagle, medusa: the draft vocabulary (the most frequent target tokens of the training answers)",
    )
    t.add_argument(
        "--answers",
        choices=("references", "self"),
        default="references",
        help="eagle, medusa: train on the data set's references, or on the fine-tuned model's own greedy answers to the "
        "training prompts (self-distilled, cached in OUT/self_distilled.jsonl)",
    )
    t.add_argument(
        "--synthetic-prompts",
        type=int,
        default=0,
        help="eagle or medusa with --answers self, e2e_nlg: this many more prompts, meaning representations drawn from the "
        "training MRs' slots and values (never a test MR)",
    )
    t.add_argument(
        "--curve-points",
        type=int,
        default=0,
        help="streaming: record held-out stream accuracy and expected tau at N points of training (of the time budget)",
    )
    t.add_argument(
        "--pruning-layer",
        type=int,
        default=None,
        help="streaming: parallel tree pruning (Sec. 3.1.3) with an early exit after this many layers (default: none)",
    )
    t.add_argument(
        "--pruning-threshold",
        type=float,
        default=0.01,
        help="streaming: prune tree nodes below this estimated transition probability",
    )
    t.add_argument(
        "--pruning-budget", type=float, default=120.0, help="streaming: seconds of training for the pruning early exit"
    )
    t.add_argument("--save-steps", type=int, default=200, help="a resumable checkpoint every N steps (0: none)")
    t.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    t.add_argument(
        "--keep-state",
        action="store_true",
        help="keep the checkpoints when the run ends, so --resume with a larger --time-budget trains on",
    )
    t.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=run_train)


def _add_prune_parser(sub) -> None:
    """Register ``downstream prune``."""
    r = sub.add_parser(
        "prune", help="add parallel tree pruning (a trained early exit, Sec. 3.1.3) to a trained streaming folder"
    )
    r.add_argument("folder", help="a 'downstream train --method streaming' folder (rewritten in place)")
    r.add_argument("--data", required=True, help="the folder's task data (its training split trains the early exit)")
    r.add_argument(
        "--pruning-layer", type=int, required=True, help="the early exit reads the state after this many layers"
    )
    r.add_argument(
        "--pruning-threshold",
        type=float,
        default=0.01,
        help="prune tree nodes below this estimated transition probability",
    )
    r.add_argument("--pruning-budget", type=float, default=120.0, help="seconds of training for the early exit")
    r.add_argument("--pruning-examples", type=int, default=1024, help="training pairs whose states it trains on")
    r.add_argument("--device", default=None)
    r.add_argument("--threads", type=int, default=None)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=run_prune)


def _add_calibrate_parser(sub) -> None:
    """Register ``downstream calibrate``."""
    c = sub.add_parser(
        "calibrate",
        help="measure a trained eagle folder's held-out accuracies on its calibration prompts, so that its default "
        "tree is sized for the machine it decodes on",
    )
    c.add_argument("folder", help="a 'downstream train --method eagle' folder (its config.json is rewritten)")
    c.add_argument("--data", required=True, help="the folder's task data (its calibration prompts)")
    c.add_argument("--device", default=None)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=run_calibrate)


def _add_eval_parser(sub) -> None:
    """Register ``downstream eval``."""
    e = sub.add_parser(
        "eval", help="plain vs speculative greedy decoding of a trained folder on the task's test prompts"
    )
    e.add_argument("folder", help="a 'downstream train' folder")
    e.add_argument("--task", required=True, choices=TASKS)
    e.add_argument("--data", required=True, help="the task's data folder")
    e.add_argument("--limit", type=int, default=None, help="the first N test prompts")
    e.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's")
    e.add_argument("--output", default=None, help="write the JSON here (default: print it)")
    e.add_argument(
        "--write-card", action="store_true", help="also write the folder's model card (README.md) with these results"
    )
    e.add_argument(
        "--drafter",
        default="prompt-lookup",
        choices=TRAINING_FREE,
        help="a lora folder's training-free drafting (arm e; suffix and hybrid-suffix are warmed with the task's "
        "training targets; engine, on any folder: its model's one-token steps through the engine, nothing drafted); "
        "other folders draft with what they trained "
        "(hybrid-suffix on a medusa2, eagle or medusa folder: merged with SuffixDecoding; hybrid-suffix-ungated: the same with "
        "the trained drafter drafting on every step)",
    )
    e.add_argument(
        "--warm-answers",
        default=None,
        help="suffix, hybrid-suffix: warm SuffixDecoding with the assistant turns of this chat jsonl instead of the "
        "training references (e.g. an eagle folder's self_distilled.jsonl: the model's own answers to training prompts)",
    )
    e.add_argument(
        "--pruning-threshold",
        type=float,
        default=None,
        help="a streaming folder with a pruning early exit: decode with this threshold instead of its own (0: no pruning)",
    )
    e.add_argument("--device", default=None)
    e.add_argument("--threads", type=int, default=None)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=run_eval)


def _add_compare_parser(sub) -> None:
    """Register ``downstream compare``."""
    c = sub.add_parser(
        "compare",
        help="several arms on one fine-tuned model in one process, beside its plain decoding (order rotating per prompt)",
    )
    c.add_argument(
        "arms",
        nargs="+",
        help="FOLDER (what it drafts with) or FOLDER:DRAFTER (a lora folder's --drafter of 'eval', e.g. :engine, "
        ":suffix, :hf-prompt-lookup; an eagle or medusa folder's :hybrid-suffix; any folder's :engine); all decode one "
        "model (lora, eagle and medusa folders on one adapter, or one medusa2 or streaming folder)",
    )
    c.add_argument("--task", required=True, choices=TASKS)
    c.add_argument("--data", required=True, help="the task's data folder")
    c.add_argument("--limit", type=int, default=None, help="the first N test prompts")
    c.add_argument(
        "--spread", action="store_true", help="with --limit N: N test prompts evenly spaced over the test set"
    )
    c.add_argument("--first", type=int, default=0, help="leave out the first N test prompts (before --limit/--spread)")
    c.add_argument("--max-new-tokens", type=int, default=None, help="default: the task's")
    c.add_argument("--output", default=None, help="write the JSON here (and the table beside it, .md)")
    c.add_argument("--warm-answers", default=None, help="warm the suffix drafters with this chat jsonl's answers")
    c.add_argument("--device", default=None)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=run_compare)


def _add_table_parser(sub) -> None:
    """Register ``downstream table``."""
    b = sub.add_parser("table", help="gather eval JSONs into a Table-1-style markdown table and a plot")
    b.add_argument("--results", default="results/downstream", help="folder of eval JSONs")
    b.add_argument("--output", default=None, help="write the markdown table here (default: print it)")
    b.add_argument("--plot", default=None, help="also save a PNG plot here")
    b.set_defaults(func=run_table)


def run_train(args) -> int:
    setup_torch(args)
    from .tasks import get_task
    from .training import DownstreamTrainingConfig, train_arm

    cfg = DownstreamTrainingConfig(
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        epochs=args.epochs,
        max_steps=args.max_steps,
        time_budget=args.time_budget,
        save_steps=args.save_steps or None,
        resume=args.resume,
        keep_state=args.keep_state,
        max_length=args.max_length or get_task(args.task).max_length,
        calibration_prompts=args.calibration_prompts,
        tree_nodes=args.tree_nodes,
        num_streams=args.num_streams,
        num_msa_layers=args.num_msa_layers,
        num_heads=args.num_heads,
        eagle_max_tokens=args.eagle_max_tokens,
        eagle_draft_vocab=args.eagle_draft_vocab,
        answers=args.answers,
        synthetic_prompts=args.synthetic_prompts,
        curve_points=args.curve_points,
        pruning_layer=args.pruning_layer,
        pruning_threshold=args.pruning_threshold,
        pruning_budget=args.pruning_budget,
        seed=args.seed,
        progress=not args.no_progress,
    )
    info = train_arm(
        args.method,
        args.task,
        args.data,
        args.out,
        cfg,
        base_model=args.model,
        device=args.device,
        adapter_folder=args.adapter,
        limit=args.limit,
        command=command_line(args),
    )
    from hf_speculative.training.distributed import is_main_process

    if is_main_process():  # under accelerate launch the other processes trained the same weights
        report = {k: v for k, v in info["training"].items() if k != "settings"}
        print(json.dumps({"task": info["task"], "method": info["method"], "out": args.out, **report}, indent=1))
    return 0


def run_prune(args) -> int:
    setup_torch(args)
    from .training import prune_folder

    record = prune_folder(
        args.folder,
        args.data,
        args.pruning_layer,
        threshold=args.pruning_threshold,
        budget=args.pruning_budget,
        examples=args.pruning_examples,
        device=args.device,
        progress=not args.no_progress,
        command=command_line(args),
    )
    print(json.dumps({"folder": args.folder, "pruning": record}, indent=1))
    return 0


def run_calibrate(args) -> int:
    setup_torch(args)
    from .training import calibrate_eagle_folder

    record = calibrate_eagle_folder(
        args.folder, args.data, device=args.device, progress=not args.no_progress, command=command_line(args)
    )
    print(json.dumps({"folder": args.folder, "calibration": record}, indent=1))
    return 0


def run_compare(args) -> int:
    setup_torch(args)
    from .compare import compare_arms, markdown_comparison

    result = compare_arms(
        args.arms,
        args.task,
        args.data,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        progress=not args.no_progress,
        warm_answers=args.warm_answers,
        spread=args.spread,
        first=args.first,
    )
    result["threads"] = args.threads
    result["command"] = command_line(args)
    table = markdown_comparison(result)
    print(table)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(result, out)
        beside_record(out, ".md").write_text(table, encoding="utf-8")
    return 0


def run_eval(args) -> int:
    setup_torch(args)
    from .evaluation import evaluate_folder

    if args.write_card and (args.drafter != "prompt-lookup" or args.pruning_threshold is not None):
        raise SystemExit(
            f"{PROGRAM} eval: --write-card records a folder's own decoding; drop it with --drafter / --pruning-threshold"
        )
    result = evaluate_folder(
        args.folder,
        args.task,
        args.data,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        progress=not args.no_progress,
        drafter=args.drafter,
        pruning_threshold=args.pruning_threshold,
        warm_answers=args.warm_answers,
    )
    result["threads"] = args.threads
    result["command"] = command_line(args)
    text = json.dumps(result, indent=1)
    if args.write_card:
        from .model_card import write_model_card
        from .training import read_downstream_info

        print(f"written {write_model_card(args.folder, read_downstream_info(args.folder), result)}", file=sys.stderr)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        write_json(result, args.output)
        print(
            f"written {args.output}: tau {result['tau']}, speedup {result['speedup']}x, lossless {result['lossless_rate']}, "
            f"metric {result['metric']}",
            file=sys.stderr,
        )
    else:
        print(text)
    return 0


def run_table(args) -> int:
    from .table import markdown_table, plot_results, read_results

    rows = read_results(args.results)
    if not rows:
        raise SystemExit(f"no eval JSONs in {args.results}")
    table = markdown_table(rows)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(table, encoding="utf-8")
        print(f"written {args.output} ({len(rows)} rows)", file=sys.stderr)
    else:
        print(table)
    if args.plot:
        plot_results(rows, args.plot)
        print(f"written {args.plot}", file=sys.stderr)
    return 0
