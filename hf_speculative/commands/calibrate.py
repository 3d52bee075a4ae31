"""``hf-speculative calibrate``: measure what a tree step costs on this machine and cache it: the kernel table (which
kernel runs the target's linear layers at each row count, `hf_speculative.engine.kernels`) and then, with those kernels, the
cost curve c(n) of the verification forward as the engine runs it.

    hf-speculative calibrate --model reference [--dtype bfloat16] [--threads 2]

Cost-aware trees (calibrated drafters, Token Recycling, hybrid trees) read the cached curve and the engine reads the
cached table; `generate()` itself never measures either.
"""

from __future__ import annotations

import json

from .common import add_model_args, parse_dtype, setup_torch


def add_parser(subparsers) -> None:
    c = subparsers.add_parser(
        "calibrate", help="measure and cache the kernel table and the cost curve c(n) (what a tree step costs here)"
    )
    add_model_args(c)
    c.add_argument("--force", action="store_true", help="measure again even if a table and curve are cached")
    c.add_argument(
        "--kernels",
        choices=["auto", "torch"],
        default="auto",
        help="auto: measure and use the fastest kernels (default); torch: price torch's own kernels",
    )
    c.set_defaults(func=run)


def run(args) -> int:
    setup_torch(args)
    from ..bench.reference import resolve_model
    from ..engine.generation import enable
    from ..engine.kernels import kernel_table_path, measure_kernel_table
    from ..engine.policy import SpeedPolicy, speed_policy
    from ..paths import write_atomically
    from ..perf_model import cost_curve_path, get_cost_curve, measure_cost_curve

    model, _ = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    # builds this CPU's kernel once; no quick table measurement: the thorough one below replaces it
    enable(model, policy=SpeedPolicy.from_env(kernels=args.kernels, measure_seconds=0))
    report = {}
    if args.kernels == "auto":
        table_path = kernel_table_path(model)
        if args.force or not table_path.exists():
            print(f"measuring the linear-layer kernels of {args.model} ({model.dtype}) on this machine ...", flush=True)
            policy = speed_policy(model)
            table = measure_kernel_table(model, kernels=policy.offered_kernels(model, model.dtype))
            write_atomically(table_path, json.dumps(table.to_dict(), indent=1) + "\n")
        enable(model, kernels=args.kernels)  # the policy reads the cached table from here on
        report["kernel_table"] = json.loads(table_path.read_text())
    path = cost_curve_path(model)
    if args.force or not path.exists():
        print(f"measuring the cost curve of {args.model} ({model.dtype}) on this machine ...", flush=True)
        measure_cost_curve(model).save(path)
    curve = get_cost_curve(model, measure_if_missing=False)
    report |= {"cost_curve": dict(zip(curve.nodes, [round(r, 3) for r in curve.ratios])), "cached_at": str(path)}
    print(json.dumps(report))
    return 0
