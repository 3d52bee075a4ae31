"""``hf-speculative calibrate``: measure the target's cost curve c(n) on this machine and cache it.

    hf-speculative calibrate --model reference [--dtype bfloat16]

Cost-aware trees (calibrated drafters, Token Recycling, hybrid trees) read the cached curve; `generate()` itself
never measures one.
"""

from __future__ import annotations

import json

from .common import add_model_args, parse_dtype, setup_torch


def add_parser(subparsers) -> None:
    c = subparsers.add_parser("calibrate", help="measure and cache the target's cost curve c(n) (what a tree step costs here)")
    add_model_args(c)
    c.add_argument("--force", action="store_true", help="measure again even if a curve is cached")
    c.set_defaults(func=run)


def run(args) -> int:
    setup_torch(args)
    from ..bench.reference import resolve_model
    from ..perf_model import cost_curve_path, get_cost_curve, measure_cost_curve

    model, _ = resolve_model(args.model, dtype=parse_dtype(args.dtype), device=args.device)
    path = cost_curve_path(model)
    if args.force or not path.exists():
        print(f"measuring the cost curve of {args.model} ({model.dtype}) on this machine ...", flush=True)
        curve = measure_cost_curve(model)
        curve.save(path)
    curve = get_cost_curve(model, measure_if_missing=False)
    print(json.dumps({"cost_curve": dict(zip(curve.nodes, [round(r, 3) for r in curve.ratios])), "cached_at": str(path)}))
    return 0
