"""Plot tau against training tokens from a JSON list of measured points.

    python scripts/plot_tau_vs_tokens.py docs/results/tau_vs_tokens.json docs/tau_vs_tokens.png

Each point: ``{"drafter": str, "train_tokens": int, "tau": float, "metric": str}``; one line per (drafter,
metric). ``metric`` says what tau is: ``"measured"`` (greedy generation, `scripts/tau_points.py`) or
``"expected"`` (the calibrated tree's expected tau on held-out conversations, from a training curve).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = json.load(open(sys.argv[1]))["points"]
    lines = defaultdict(list)
    for p in points:
        lines[(p["drafter"], p["metric"])].append((p["train_tokens"], p["tau"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (drafter, metric), xy in sorted(lines.items()):
        xy.sort()
        ax.plot(
            [x / 1e6 for x, _ in xy],
            [y for _, y in xy],
            "o-" if metric == "measured" else "s--",
            label=f"{drafter} ({metric})",
        )
    ax.set_xscale("symlog", linthresh=0.05)
    ax.set_xlabel("training tokens seen (millions)")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.set_title("tau against training data, SmolLM2-135M-Instruct")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
