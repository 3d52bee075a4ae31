"""``downstream table``: the eval JSONs of ``downstream eval`` gathered into a Table-1-style markdown table
(Speculative Streaming, Sec. 4.1: rows arm x task; speedup, tokens per step, task metric, extra parameters,
training time) and a plot of speedup and tokens per step per task."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ARM_NAMES", "read_results", "markdown_table", "plot_results"]

TASK_ORDER = ("e2e_nlg", "wikisql", "dialogsum")
TASK_NAMES = {"e2e_nlg": "E2E NLG", "wikisql": "WikiSQL", "dialogsum": "DialogSum"}
ARM_NAMES = {
    "lora": "LoRA fine-tuning (+ training-free drafting)",
    "medusa2": "Medusa-2",
    "eagle": "EAGLE-3 (on the LoRA model)",
    "medusa": "Medusa heads (on the LoRA model)",
    "streaming": "Speculative Streaming (shared)",
}
REQUIRED = ("task", "method", "tau", "speedup", "lossless_rate", "metric", "extra_parameters", "n")


def read_results(folder: str | Path) -> list[dict]:
    """Every eval JSON in ``folder`` (files without the eval fields are skipped), in table order."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and all(k in data for k in REQUIRED):
            rows.append(data)
    order = {m: i for i, m in enumerate(ARM_NAMES)}
    rows.sort(
        key=lambda r: (
            TASK_ORDER.index(r["task"]) if r["task"] in TASK_ORDER else 99,
            order.get(r["method"], 99),
            r.get("drafter", ""),
        )
    )
    return rows


def _metric(row: dict) -> str:
    m = row["metric"]
    return ", ".join(f"{k} {100 * v:.1f}" for k, v in m.items())


def _params(n) -> str:
    if not n:
        return "0"
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def _minutes(s) -> str:
    return "-" if s is None else f"{s / 60:.1f} min"


def markdown_table(rows: list[dict]) -> str:
    """The Table-1-style markdown table of eval records (`read_results`)."""
    lines = [
        "| task | arm | decoding | speedup | tokens/step (tau) | metric | extra parameters | training time (steps) | lossless | n |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {TASK_NAMES.get(r['task'], r['task'])} | {ARM_NAMES.get(r['method'], r['method'])} | {r.get('drafter', '')} "
            f"| {r['speedup']:.2f}x | {'-' if r['tau'] is None else format(r['tau'], '.2f')} | {_metric(r)} | {_params(r['extra_parameters'])} "
            f"| {_minutes(r.get('train_seconds'))} ({r.get('train_steps', '-')}) | {r['lossless_rate']:.2f} | {r['n']} |"
        )
    return "\n".join(lines) + "\n"


def plot_results(rows: list[dict], path: str | Path) -> Path:
    """Grouped bars: speedup and tokens per step of every arm, per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in TASK_ORDER if any(r["task"] == t for r in rows)] or sorted({r["task"] for r in rows})
    order = {m: i for i, m in enumerate(ARM_NAMES)}
    arms = sorted({(r["method"], r.get("drafter", "")) for r in rows}, key=lambda a: (order.get(a[0], 99), a[1]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / max(len(arms), 1)
    for ax, key, label in (
        (axes[0], "speedup", "speedup over own plain decoding"),
        (axes[1], "tau", "tokens per step (tau)"),
    ):
        for j, arm in enumerate(arms):
            values = [
                next(
                    (r[key] or 0.0 for r in rows if r["task"] == t and (r["method"], r.get("drafter", "")) == arm), 0.0
                )
                for t in tasks
            ]
            label_ = ARM_NAMES.get(arm[0], arm[0]) if arm[0] != "lora" else f"LoRA + {arm[1]}"
            ax.bar([i + j * width for i in range(len(tasks))], values, width, label=label_)
        ax.set_xticks([i + width * (len(arms) - 1) / 2 for i in range(len(tasks))])
        ax.set_xticklabels([TASK_NAMES.get(t, t) for t in tasks])
        ax.set_ylabel(label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=7)
    from hf_speculative.plotting import save_figure

    return save_figure(fig, path)
