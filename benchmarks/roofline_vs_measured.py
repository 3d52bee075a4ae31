"""Measured batched speedups beside the roofline model's prediction for this CPU.

Reads a batched bench JSON, e.g.

    python -m hf_speculative.cli bench --model reference --batch-size 1,4,8,16 \\
        --methods plain,tree-layercut,chain-layercut,tree-prompt-lookup --output bench_batch.json

and for every method and batch size B prints the measured speedup over plain batched ``generate()`` next to SPIRe's
throughput multiplier ``tau / Delta t`` from `hf_speculative.perf_model` with the *measured* tau of that method at that
B, the reference model's shape (SmolLM2-135M, float32) and this CPU's FLOP/s and bandwidth (`Hardware.measure_cpu`,
measured once and cached). Where the two differ, the gap is what the roofline leaves out on a CPU: Python and kernel
launch overheads, the engine's bookkeeping, attention kernels below peak.

How a bench method maps onto the model:

* layer-cut drafts (``tree-layercut``, ``chain-layercut``): ``vanilla``, the draft being the target's first
  ``draft_layers`` layers with its own full KV cache;
* a SPIRe drafter folder (``--drafter``): ``spire``, with its config's layers, S and W;
* a MagicDec method (name or drafter type containing "magicdec"): ``magicdec``;
* a causal-LM drafter folder: ``vanilla`` with its config's shape;
* anything else (prompt lookup, Medusa heads, ParallelSpec, EAGLE): ``verify-only`` -- drafting counted as free, so
  the prediction is an upper bound for drafters that run a network.

The draft depth k is the tree's depth and the verification forward covers the tree's nodes + 1 tokens (the measured
mean per row, ``verified_tokens_per_row``, where the bench JSON has it). The context L
is ``--prompt-tokens`` + half of ``max_new_tokens`` (the bench JSON does not record prompt lengths).

    python benchmarks/roofline_vs_measured.py bench_batch.json --plot perf_model_vs_measured.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from roofline import Hardware, throughput_multiplier

from hf_speculative.perf_model import SHAPES, ModelShape


def _depth(settings: dict, nodes: int | None) -> int:
    tree = settings.get("tree")
    if isinstance(tree, list) and tree:
        return max(len(path) for path in tree)
    return int(nodes or 1)  # a dynamic tree (recorded as text): at most one node per depth


def _drafter_config(settings: dict) -> dict | None:
    path = settings.get("drafter")
    config = Path(path) / "config.json" if path else None
    return json.loads(config.read_text()) if config is not None and config.exists() else None


def model_method(name: str, settings: dict, target: ModelShape) -> tuple[str, ModelShape | None, dict]:
    """The roofline method, draft shape and sparse-cache settings of a bench method."""
    config = _drafter_config(settings)
    kind = f"{name} {settings.get('drafter_type', '')} {(config or {}).get('model_type', '')}".lower()
    window = {}
    if config is not None:
        window = {
            "sliding_window": config.get("sliding_window") or 64,
            "sink_tokens": config.get("num_sink_tokens") or 1,
        }
    if "magicdec" in kind:
        window = {
            "sliding_window": settings.get("sliding_window", window.get("sliding_window", 64)),
            "sink_tokens": settings.get("num_sink_tokens", window.get("sink_tokens", 1)),
        }
        return "magicdec", None, window
    if "spire" in kind:
        layers = (config or {}).get("num_hidden_layers", 2)
        return (
            "spire",
            target.truncated(layers, name=f"spire:{layers}"),
            window or {"sliding_window": 64, "sink_tokens": 1},
        )
    if settings.get("draft_layers"):
        layers = int(settings["draft_layers"])
        return "vanilla", target.truncated(layers, name=f"layer-cut:{layers}"), {}
    if config is not None and any(a.endswith("ForCausalLM") for a in config.get("architectures") or []):
        return "vanilla", ModelShape.from_config(config, dtype_bytes=target.dtype_bytes, name=settings["drafter"]), {}
    return "verify-only", None, {}


def compare(result: dict, target: ModelShape, hw: Hardware, context: int) -> list[dict]:
    rows = []
    methods = result["setting"].get("methods", {})
    for b, per_method in result["batches"].items():
        for name, s in per_method.items():
            if name == "plain" or s.get("tau") is None:
                continue
            settings = methods.get(name, {})
            method, draft, window = model_method(name, settings, target)
            nodes = s.get("tree_nodes") or settings.get("tree_nodes")
            k = _depth(settings, nodes)
            verify = int(nodes) + 1 if nodes else k + 1
            if s.get("verified_tokens_per_row"):  # measured: a trie drafter fills only part of its tree budget
                verify = max(1, round(float(s["verified_tokens_per_row"])))
            predicted = throughput_multiplier(
                method, target, draft, hw, int(b), context, k, float(s["tau"]), verify_tokens=verify, **window
            )
            rows.append(
                {
                    "method": name,
                    "model": method,
                    "draft": draft.name if draft is not None else None,
                    "batch_size": int(b),
                    "k": k,
                    "verify_tokens": verify,
                    "tau": float(s["tau"]),
                    "measured_speedup": float(s["speedup"]),
                    "projected_speedup": predicted,
                }
            )
    return rows


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    names = list(dict.fromkeys(r["method"] for r in rows))
    for i, name in enumerate(names):
        mine = [r for r in rows if r["method"] == name]
        sizes = [r["batch_size"] for r in mine]
        color = f"C{i}"
        ax.plot(sizes, [r["measured_speedup"] for r in mine], marker="o", color=color, label=f"{name} measured")
        ax.plot(
            sizes,
            [r["projected_speedup"] for r in mine],
            marker="x",
            linestyle="--",
            color=color,
            label=f"{name} projected ({mine[0]['model']})",
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    sizes = sorted({r["batch_size"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("speedup over plain batched generate (x)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_json", help="a batched bench JSON (hf-speculative bench --batch-size ... --output)")
    p.add_argument("--target", default="smollm2-135m", help="target shape name or config.json (default: the reference)")
    p.add_argument("--dtype-bytes", type=int, default=4, help="bytes per weight / KV element (bench runs float32: 4)")
    p.add_argument("--threads", type=int, default=None, help="threads for the CPU measurement (default: the bench's)")
    p.add_argument("--prompt-tokens", type=int, default=100, help="mean prompt length, for the context L")
    p.add_argument("--plot", default=None, help="PNG: measured (solid) and projected (dashed) speedup against B")
    p.add_argument("--json", default=None, help="write the comparison rows as JSON")
    args = p.parse_args()

    from hf_speculative.bench.report import read_json

    result = read_json(args.bench_json)
    if "batches" not in result:
        raise SystemExit(f"{args.bench_json} is not a batched bench JSON (run bench with --batch-size)")
    setting = result["setting"]
    if args.target in SHAPES:
        target = ModelShape.from_name(args.target, dtype_bytes=args.dtype_bytes)
    else:
        target = ModelShape.from_json(args.target, dtype_bytes=args.dtype_bytes)
    hw = Hardware.measure_cpu(threads=args.threads or setting.get("threads"))
    context = args.prompt_tokens + int(setting.get("max_new_tokens", 128)) // 2
    print(
        f"{hw.name}: {hw.flops / 1e9:.1f} GFLOP/s, {hw.bandwidth / 1e9:.1f} GB/s (HOI {hw.hoi:.1f} FLOP/B); "
        f"target {target.name}, {target.num_parameters / 1e6:.1f} M params, {target.dtype_bytes} B/param; L = {context}"
    )
    rows = compare(result, target, hw, context)
    print("| method | model | B | k | verify tokens | tau (measured) | speedup measured | speedup projected |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['method']} | {r['model']} | {r['batch_size']} | {r['k']} | {r['verify_tokens']} | {r['tau']:.2f} | "
            f"{r['measured_speedup']:.2f}x | {r['projected_speedup']:.2f}x |"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"hardware": hw.to_dict(), "target": target.to_dict(), "context": context, "rows": rows}, indent=1
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    if args.plot:
        title = f"{setting.get('model', 'reference')} on {hw.name}: measured vs projected (roofline, measured tau), L={context}"
        plot(rows, args.plot, title)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
