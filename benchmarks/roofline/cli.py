"""``python benchmarks/run_roofline.py``: SPIRe's projected throughput multiplier over batch size x context length,
from the roofline cost model (`roofline.model`); a table per method, a Fig. 4-style heatmap, JSON.

    python benchmarks/run_roofline.py --target llama-3-8b --draft spire:2 --hardware h100 --k 4 --alpha 0.8 \\
        --output heatmap.png --json grid.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

METHOD_CHOICES = ("vanilla", "magicdec", "spire", "all")
HARDWARE_CHOICES = ("h100", "h200", "a100", "cpu")


def _ints(text: str) -> list[int]:
    values = [int(v) for v in str(text).split(",") if v.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"want a comma list of positive integers, got {text!r}")
    return values


PROGRAM = "python benchmarks/run_roofline.py"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROGRAM,
        description="SPIRe's throughput model: multiplier = tau / Delta t, Delta t = (k draft forwards + verification over "
        "k+1 tokens) / one plain decoding step, each forward max(FLOPs / FLOP/s, bytes / B/s). Numbers are projected.",
    )
    p.add_argument(
        "--target",
        default="llama-3-8b",
        help="target: a shape name (llama-3-8b, llama-2-7b, ...), a config.json "
        "(or its folder), or 'reference' (SmolLM2-135M); default llama-3-8b",
    )
    p.add_argument(
        "--draft",
        default=None,
        help="draft: a shape name or config.json (a dense draft LM for vanilla; a drafter "
        "for spire), 'spire:N' (N layers of the target's shape, sparse KV) or 'magicdec' (the target itself, "
        "sparse KV); also picks --method when that is not given (default spire:2)",
    )
    p.add_argument(
        "--method",
        choices=METHOD_CHOICES,
        default=None,
        help="vanilla | magicdec | spire | all (default: from --draft)",
    )
    p.add_argument(
        "--hardware",
        choices=HARDWARE_CHOICES,
        default="h100",
        help="h100 | h200 | a100 (data-sheet peaks) or cpu (measured here once, cached); default h100",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads for --hardware cpu")
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="weight and KV-cache dtype (default bfloat16 on GPU presets, float32 on cpu)",
    )
    p.add_argument("--k", type=int, default=4, help="draft tokens per step (chain depth); default 4")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tau", type=float, help="tokens committed per step (bonus included), e.g. measured by bench")
    g.add_argument("--alpha", type=float, help="per-token acceptance rate: tau = (1 - alpha^(k+1)) / (1 - alpha)")
    p.add_argument("--sliding-window", type=int, default=64, help="W of the sparse draft KV cache (default 64)")
    p.add_argument("--sink-tokens", type=int, default=1, help="S of the sparse draft KV cache (default 1)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256", help="comma list of batch sizes B (rows)")
    p.add_argument(
        "--contexts", default="256,512,1024,2048,4096,8192,16384,32768", help="comma list of context lengths L"
    )
    p.add_argument("--output", default=None, help="heatmap PNG (with --method all: one per method, NAME_<method>.png)")
    p.add_argument("--title", default=None, help="heatmap title (always marked projected)")
    p.add_argument("--json", default=None, help="write the grids as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return run(args)


def _shape(spec: str, dtype_bytes: int):
    from hf_speculative.perf_model import SHAPES, ModelShape

    if spec == "reference":
        return ModelShape.from_name("smollm2-135m", dtype_bytes=dtype_bytes)
    if spec in SHAPES:
        return ModelShape.from_name(spec, dtype_bytes=dtype_bytes)
    if Path(spec).exists():
        return ModelShape.from_json(spec, dtype_bytes=dtype_bytes)
    raise ValueError(
        f"{spec!r} is neither a known shape ({', '.join(sorted(SHAPES))}, reference) nor a config.json path"
    )


def _spire_layers(draft: str | None) -> int | None:
    if draft is None or not draft.startswith("spire:"):
        return None
    try:
        return int(draft.split(":", 1)[1])
    except ValueError:
        raise ValueError(f"--draft spire:N wants an integer N, got {draft!r}") from None


def _plan(args, target, dtype_bytes: int) -> list[tuple[str, object]]:
    """``[(method, draft shape or None)]`` from ``--method`` and ``--draft``."""
    draft, method = args.draft, args.method
    layers = _spire_layers(draft)
    dense = None if draft in (None, "magicdec") or layers is not None else _shape(draft, dtype_bytes)
    spire = target.truncated(
        layers or 2, name=f"spire:{layers or 2}"
    )  # N of the target's layers, its embedding and head
    if method is None:
        method = "magicdec" if draft == "magicdec" else "vanilla" if dense is not None else "spire"
    if method == "all":
        plan = [("vanilla", dense)] if dense is not None else []
        if dense is None:
            print("vanilla skipped: it needs --draft SHAPE|CONFIG (a smaller dense LM, e.g. llama-3.2-1b)")
        return plan + [("magicdec", None), ("spire", spire)]
    if method == "vanilla":
        if dense is None:
            raise ValueError("--method vanilla needs --draft SHAPE|CONFIG: a smaller dense LM (e.g. llama-3.2-1b)")
        return [("vanilla", dense)]
    if method == "magicdec":
        if draft not in (None, "magicdec"):
            raise ValueError(f"--method magicdec drafts with the target itself; --draft {draft!r} does not fit")
        return [("magicdec", None)]
    if draft == "magicdec":
        raise ValueError("--draft magicdec means --method magicdec")
    return [("spire", dense if dense is not None else spire)]


def run(args) -> int:
    from hf_speculative.perf_model import DTYPE_BYTES

    from .model import Hardware, expected_tau, plot_heatmap, speedup_grid

    if args.k < 1:
        raise ValueError(f"--k must be >= 1, got {args.k}")
    hw = Hardware.measure_cpu(threads=args.threads) if args.hardware == "cpu" else Hardware.preset(args.hardware)
    dtype = args.dtype or ("float32" if args.hardware == "cpu" else "bfloat16")
    dtype_bytes = DTYPE_BYTES[dtype]
    target = _shape(args.target, dtype_bytes)
    tau = args.tau if args.tau is not None else expected_tau(args.alpha, args.k)
    if tau <= 0:
        raise ValueError(f"--tau must be > 0, got {tau}")
    batch_sizes, contexts = _ints(args.batch_sizes), _ints(args.contexts)
    tau_text = f"tau={tau:.2f}" + (f" (alpha={args.alpha:g})" if args.alpha is not None else "")
    print(
        f"{hw.name}: {hw.flops / 1e12:.3g} TFLOP/s, {hw.bandwidth / 1e9:.4g} GB/s, HOI {hw.hoi:.1f} FLOP/B; "
        f"target {target.name} ({target.num_parameters / 1e9:.3g} B params, {dtype}); k={args.k}, {tau_text}"
    )
    record = {
        "kind": "projected",
        "model": "SPIRe throughput model: multiplier = tau / Delta t; forward time = max(FLOPs / FLOP/s, bytes / B/s)",
        "hardware": hw.to_dict(),
        "target": target.to_dict(),
        "k": args.k,
        "tau": tau,
        "alpha": args.alpha,
        "dtype": dtype,
        "sliding_window": args.sliding_window,
        "sink_tokens": args.sink_tokens,
        "command": f"{PROGRAM} " + " ".join(shlex.quote(a) for a in args.argv),
        "methods": {},
    }
    plan = _plan(args, target, dtype_bytes)
    for method, draft in plan:
        grid = speedup_grid(
            method,
            target,
            draft,
            hw,
            args.k,
            tau,
            batch_sizes,
            contexts,
            sliding_window=args.sliding_window,
            sink_tokens=args.sink_tokens,
        )
        window = f", sparse KV S={args.sink_tokens} W={args.sliding_window}" if method != "vanilla" else ""
        print(f"\nprojected throughput multiplier, {method} (draft {grid.draft}{window}), rows B, columns L:")
        print(grid.table())
        record["methods"][method] = {**grid.to_dict(), "draft_shape": None if draft is None else draft.to_dict()}
        if args.output:
            path = Path(args.output)
            if len(plan) > 1:
                path = path.with_name(f"{path.stem}_{method}{path.suffix or '.png'}")
            title = args.title or (
                f"Projected throughput multiplier, {method}: {target.name} on {hw.name}\n"
                f"draft {grid.draft}{window}, k={args.k}, {tau_text}"
            )
            print(f"wrote {plot_heatmap(grid, path, title=title)}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
