"""``hf-speculative bench``: time speculative methods against plain ``generate()`` on a prompt set
(the harness is `hf_speculative.bench.harness`)."""

from __future__ import annotations

import sys

from .common import add_model_args, parse_dtype, setup_torch

BUILTIN_METHODS = "plain, engine (nothing drafted), hf-assisted, hf-prompt-lookup, tree-layercut, chain-layercut, tree-prompt-lookup, magicdec"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time speculative methods against plain generate() on a prompt set")
    add_model_args(p)
    _add_method_args(p)
    _add_magicdec_args(p)
    _add_assisted_args(p)
    _add_model_free_args(p)
    _add_prompt_args(p)
    _add_output_args(p)
    _add_mode_args(p)
    p.set_defaults(func=run)


def _add_method_args(p) -> None:
    """Which methods run, the trained drafters among them, and the tree or chain they draft."""
    p.add_argument(
        "--methods",
        default="plain,engine,hf-assisted,hf-prompt-lookup,tree-layercut",
        help=f"comma list; built in: {BUILTIN_METHODS}; plus one per --drafter. 'engine' (the engine's loop "
        "with nothing drafted) runs right after plain: a method's tokens/s over its own is speculation's "
        "own share of the speedup",
    )
    p.add_argument(
        "--drafter",
        action="append",
        help="[NAME=]PATH of a trained drafter (repeatable); method NAME (default: its config's model_type)",
    )
    p.add_argument("--draft-layers", type=int, default=8, help="layers kept by the layer-cut draft (default 8)")
    p.add_argument(
        "--tree",
        default=None,
        help="'cartesian:4,2,2,1', 'chain:5', a JSON list of choices or a JSON file (default: the drafter's own tree)",
    )
    p.add_argument(
        "--chain-length", type=int, default=4, help="drafted tokens per step for chain-layercut and magicdec"
    )


def _add_magicdec_args(p) -> None:
    """MagicDec's draft: the target with a sparse (sliding window and sink) KV cache."""
    p.add_argument(
        "--magicdec-window", type=int, default=64, help="magicdec: sliding window W of the draft's sparse KV cache"
    )
    p.add_argument(
        "--magicdec-sinks", type=int, default=1, help="magicdec: attention sink tokens S kept in the draft's cache"
    )
    p.add_argument(
        "--magicdec-positions",
        default="cache",
        choices=["cache", "original"],
        help="magicdec: rotary positions within the sparse cache (default, as StreamingLLM) or of the text",
    )


def _add_assisted_args(p) -> None:
    """transformers' assisted generation (hf-assisted)."""
    p.add_argument(
        "--assistant-tokens", type=int, default=5, help="hf-assisted num_assistant_tokens (-1: transformers default)"
    )
    p.add_argument(
        "--assistant-schedule", default="heuristic", choices=["default", "constant", "heuristic", "heuristic_transient"]
    )
    p.add_argument(
        "--assistant-confidence",
        type=float,
        default=0.0,
        help="hf-assisted assistant_confidence_threshold (-1: transformers default 0.4)",
    )


def _add_model_free_args(p) -> None:
    """The drafters without a model: Token Recycling, SuffixDecoding and prompt lookup."""
    p.add_argument(
        "--recycling",
        default=None,
        help="token-recycling / hybrid: start from this saved TokenRecyclingDrafter "
        "folder (hf-speculative warm-recycling); default: an empty matrix that learns over the run",
    )
    p.add_argument(
        "--suffix",
        default=None,
        help="suffix / hybrid part sx: start from this saved SuffixDrafter folder "
        "(hf-speculative warm-suffix); default: an empty structure that learns the run's outputs",
    )
    p.add_argument("--prompt-lookup-tokens", type=int, default=3)
    p.add_argument("--max-matching-ngram", type=int, default=2)


def _add_prompt_args(p) -> None:
    """The prompt set and how each prompt is generated and timed."""
    p.add_argument(
        "--prompts",
        default="mt_bench",
        help="a built-in set (mt_bench, the default; alpaca, dialogsum, "
        "e2e_nlg, wikisql, heldout = those four; gsm8k, humaneval), a prompt file, or a datasets id NAME[:SPLIT]",
    )
    p.add_argument(
        "--limit", type=int, default=None, help="N prompts, taken round robin over the prompt set's categories"
    )
    p.add_argument("--per-category", type=int, default=None, help="first N prompts of each category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed runs per prompt (per batch with --batch-size) and method (median is used; spread reported)",
    )


def _add_output_args(p) -> None:
    """What is written besides the printed tables."""
    p.add_argument("--output", default=None, help="result JSON")
    p.add_argument("--plot", default=None, help="PNG of speedup and tau per category")
    p.add_argument("--save-text", action="store_true", help="store decoded outputs in the JSON")
    p.add_argument(
        "--no-numerics-floor",
        dest="numerics_floor",
        action="store_false",
        help="skip the numerics floor (greedy runs measure, untimed, how often plain generate() changes "
        "its output as one row of a batch of 2 and with its prefill split in two: the rounding noise "
        "that bfloat16/float16 outputs are read against)",
    )


def _add_mode_args(p) -> None:
    """The other benchmarks: published shapes (cost side) and batched throughput."""
    p.add_argument(
        "--shapes",
        default=None,
        help="the cost side at published shapes instead, random weights, no download: "
        "comma list of NAME (qwen2.5-0.5b, llama-3.2-1b, llama-3.2-3b, mistral-7b, llama-3.1-8b, ... tiny) "
        "in --dtype float32 and/or bfloat16 (a comma list; float32 up to 3B parameters): plain tok/s, the "
        "engine's one-token step, tree costs, peak memory, first-call overhead and projected speedups; "
        "--output J.json also writes J.md and J.png",
    )
    p.add_argument("--shape-tokens", type=int, default=16, help="--shapes: new tokens per timed generate (default 16)")
    p.add_argument(
        "--batch-size",
        default=None,
        help="batched throughput instead: comma list of batch sizes B (e.g. "
        "1,4,8,16); prompts left padded in batches of B, total new tokens/s against plain batched generate, "
        "tau per row; --plot draws speedup against B",
    )


def _resolve_drafters(args) -> dict:
    """``--drafter [NAME=]PATH`` as ``{method name: local folder}`` (a missing folder fails here)."""
    from ..bench.harness import drafter_method_name
    from ..hub import resolve_name_or_path

    drafters = {}
    for spec in args.drafter or []:
        name, _, path = spec.rpartition("=")
        path = resolve_name_or_path(path, what="drafter")
        drafters[name or drafter_method_name(path)] = path
    return drafters


def _bench_options(args, drafters: dict):
    """The harness's ``BenchOptions`` from the command line."""
    from ..bench.harness import BenchOptions
    from ..hub import resolve_name_or_path

    return BenchOptions(
        draft_layers=args.draft_layers,
        tree=args.tree,
        chain_length=args.chain_length,
        assistant_tokens=None if args.assistant_tokens < 0 else args.assistant_tokens,
        assistant_schedule=None if args.assistant_schedule == "default" else args.assistant_schedule,
        assistant_confidence=None if args.assistant_confidence < 0 else args.assistant_confidence,
        prompt_lookup_tokens=args.prompt_lookup_tokens,
        max_matching_ngram=args.max_matching_ngram,
        magicdec_window=args.magicdec_window,
        magicdec_sinks=args.magicdec_sinks,
        magicdec_positions=args.magicdec_positions,
        drafters=drafters,
        recycling=str(resolve_name_or_path(args.recycling, what="Token Recycling drafter")) if args.recycling else None,
        suffix=str(resolve_name_or_path(args.suffix, what="SuffixDecoding drafter")) if args.suffix else None,
    )


def run(args) -> int:
    setup_torch(args)
    if args.shapes:
        return _run_shapes(args)
    from ..bench.harness import run_benchmark
    from ..bench.prompts import first_per_category, load_prompts, spread_over_categories
    from ..bench.reference import resolve_model
    from ..bench.report import plot_results, write_json

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    # bad input fails here, before the model loads: a missing drafter folder or prompt file, an unreachable Hub
    drafters = _resolve_drafters(args)
    records = load_prompts(args.prompts)
    options = _bench_options(args, drafters)
    model, tokenizer = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    if args.per_category:
        records = first_per_category(records, args.per_category)
    if args.limit is not None:
        records = spread_over_categories(records, args.limit)
    if args.batch_size:
        return _run_batched(args, model, tokenizer, records, methods, options)
    result = run_benchmark(
        model,
        tokenizer,
        records,
        methods,
        options,
        repeats=args.repeats,
        save_text=args.save_text,
        extra_setting=_setting(args),
        checkpoint=(lambda partial: write_json(partial, args.output)) if args.output else None,
        numerics_floor=args.numerics_floor,
        **_generation(args),
    )
    _record_peak(result)
    _print_summary(result, args.repeats)
    return _write_outputs(
        args, result, len(records), lambda path, title: plot_results(result["methods"], path, title=title)
    )


def _print_summary(result: dict, repeats: int) -> None:
    """The result's tables: every method, speedups, the numerics floor, speedup per category, repeat spread."""
    from ..bench.harness import machine_line
    from ..bench.report import category_table, floor_lines, markdown_table, speedup_lines

    print()
    print(
        f"{result['setting']['dtype']}; identical to plain: share of prompts whose greedy output equals plain "
        "generate()'s in the same dtype; first divergence: index of the first differing new token"
    )
    print(markdown_table(result["methods"]))
    print(machine_line(result["setting"]))
    print(speedup_lines(result["methods"], repeats))
    if "numerics_floor" in result:
        print()
        print(floor_lines(result["numerics_floor"]))
    print()
    print("speedup per category:")
    print(category_table(result["methods"], "speedup"))
    for name, s in result["methods"].items():
        if s.get("repeats"):
            r = s["repeats"]
            print(
                f"{name}: median tokens/s per repeat {[round(x, 2) for x in r['median_tokens_per_s_per_repeat']]}, "
                f"spread {100 * r['relative_spread']:.1f}%"
            )


def _run_shapes(args) -> int:
    """``--shapes``: random-weight targets of published shapes (`hf_speculative.bench.shape_bench`); a shape that is
    not built here (unknown, float32 above 3B parameters, more memory than available) is refused before anything is
    allocated, exit status 2."""
    from ..bench.shape_bench import run_shape_bench, shapes_markdown, write_shape_outputs

    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    dtypes = [
        {"fp32": "float32", "bf16": "bfloat16"}.get(d.strip(), d.strip()) for d in args.dtype.split(",") if d.strip()
    ]
    try:
        result = run_shape_bench(names, dtypes, tokens=args.shape_tokens, seed=args.seed, repeats=max(args.repeats, 2))
    except ValueError as err:
        print(f"hf-speculative bench: error: {err}", file=sys.stderr)
        return 2
    result["setting"]["command"] = _command(args)
    print()
    print(shapes_markdown(result))
    if not args.output:
        print(
            "results not written to a file (no --output given; --output shapes.json writes the JSON, a markdown table "
            "and a plot next to it)"
        )
        return 0
    for path in write_shape_outputs(result, args.output):
        print(f"wrote {path}")
    return 0


def _run_batched(args, model, tokenizer, records, methods, options) -> int:
    from ..bench.batch import BATCH_UNSUPPORTED, batch_table, plot_batch_speedup, run_batch_benchmark
    from ..bench.harness import machine_line

    sizes = [int(b) for b in str(args.batch_size).split(",") if b.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--batch-size wants positive batch sizes, got {args.batch_size!r}")
    skipped = [m for m in methods if m in BATCH_UNSUPPORTED]
    if skipped:
        print(f"skipping {', '.join(skipped)}: transformers runs them on one sequence only")
    result = run_batch_benchmark(
        model, tokenizer, records, methods, sizes, options, repeats=args.repeats, **_generation(args)
    )
    result["setting"].update(_setting(args))
    _record_peak(result)
    print()
    print(batch_table(result))
    print(machine_line(result["setting"]))
    return _write_outputs(args, result, len(records), lambda path, title: plot_batch_speedup(result, path, title=title))


def _generation(args) -> dict:
    """How every prompt is generated, from the command line: the harness's keyword arguments."""
    return {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "device": args.device,
    }


def _command(args) -> str:
    """The command as typed."""
    return "hf-speculative " + " ".join(getattr(args, "argv", None) or sys.argv[1:])


def _setting(args) -> dict:
    """What a result's ``setting`` records of the command line besides the harness's own: the model, the prompt set
    and the command."""
    from ..bench.prompts import describe_prompts

    return {"model": str(args.model), "prompts": describe_prompts(args.prompts), "command": _command(args)}


def _record_peak(result: dict) -> None:
    """The process's peak resident memory once every method ran (the model and every method's drafter)."""
    from ..bench.shapes import peak_resident_memory

    result["setting"]["peak_resident_bytes"] = peak_resident_memory()


def _write_outputs(args, result: dict, num_prompts: int, plot) -> int:
    """``--output`` (the result as JSON) and ``--plot`` (``plot(path, title)``), each announced."""
    from ..bench.prompts import describe_prompts
    from ..bench.report import write_json

    if args.output:
        print(f"wrote {write_json(result, args.output)}")
    else:
        print("results not written to a file (no --output given; --output results.json keeps them as JSON)")
    if args.plot:
        title = (
            f"{args.model} on {describe_prompts(args.prompts)}, {num_prompts} prompts, {args.max_new_tokens} new tokens"
        )
        print(f"wrote {plot(args.plot, title)}")
    return 0
