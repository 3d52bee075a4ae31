"""tau against training time of downstream Speculative Streaming runs: the learning curve that ``downstream train
--curve-points N`` records in a folder's ``downstream.json`` (held-out expected tau of the tree calibrated at each
point) beside the measured tau of ``downstream eval`` JSONs, as a markdown table and a plot.

    python benchmarks/downstream_curve.py --folder model_cards/speculative-streaming-smollm2-135m-e2e-nlg-60min \\
        --evals docs/results/downstream/e2e_nlg_streaming.json docs/results/downstream_longer/*.json \\
        --plot docs/results/downstream_curve.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def curve_rows(folder: Path) -> list[dict]:
    """The learning-curve points of a trained folder (minutes, steps, expected tau, per-stream top-1)."""
    training = json.loads((folder / "downstream.json").read_text())["training"]
    return [
        {
            "minutes": p["train_seconds"] / 60,
            "steps": p["step"],
            "expected_tau": p["expected_tau_calibrated"],
            "top1": p["stream_top1"],
        }
        for p in training.get("learning_curve", [])
    ]


def eval_points(paths: list[Path]) -> list[dict]:
    """Measured tau and speedup of eval JSONs against their folder's training time."""
    points = []
    for path in paths:
        r = json.loads(path.read_text())
        points.append(
            {
                "minutes": r["train_seconds"] / 60,
                "steps": r.get("train_steps"),
                "tau": r["tau"],
                "speedup": r["speedup"],
                "drafter": r["drafter"],
                "file": path.name,
            }
        )
    return sorted(points, key=lambda p: p["minutes"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", required=True, type=Path, help="a 'downstream train --curve-points' folder")
    p.add_argument("--evals", nargs="*", type=Path, default=[], help="eval JSONs of streaming folders (measured tau)")
    p.add_argument("--plot", default=None, help="write the plot here")
    args = p.parse_args()
    curve, measured = curve_rows(args.folder), eval_points(args.evals)
    on_clock = {c["steps"]: c["minutes"] for c in curve}
    for m in measured:  # an eval of the curve's own run: its training time on the budget's clock (without measuring)
        m["minutes"] = on_clock.get(m["steps"], m["minutes"])
    print("| training time | steps | held-out top-1 per stream | expected tau (calibrated 16-node tree) |")
    print("|---:|---:|---|---:|")
    for c in curve:
        print(
            f"| {c['minutes']:.1f} min | {c['steps']} | {' / '.join(f'{a:.3f}' for a in c['top1'])} | {c['expected_tau']:.2f} |"
        )
    if measured:
        print("\n| eval JSON | training time | steps | decoding | measured tau | speedup |")
        print("|---|---:|---:|---|---:|---:|")
        for m in measured:
            print(
                f"| `{m['file']}` | {m['minutes']:.1f} min | {m['steps']} | {m['drafter']} | {m['tau']:.2f} | {m['speedup']:.2f}x |"
            )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from hf_speculative.plotting import save_figure

        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(
            [c["minutes"] for c in curve],
            [c["expected_tau"] for c in curve],
            "o-",
            label="expected tau (held-out, calibrated tree)",
        )
        if measured:
            ax.plot(
                [m["minutes"] for m in measured], [m["tau"] for m in measured], "s", label="measured tau (test prompts)"
            )
        ax.axhline(3.0, color="grey", ls="--", lw=0.8, label="target tau 3.0")
        ax.set_xlabel("training time (minutes, 2-core CPU)")
        ax.set_ylabel("tokens per step (tau)")
        ax.legend(fontsize=7)
        print(f"\nwritten {save_figure(fig, args.plot)}")


if __name__ == "__main__":
    main()
