"""Benchmark arithmetic and reports: tau, speedup, step overhead, lossless rate, tables, plots.

Definitions (the same as Spec-Bench, Xia et al. 2024, and DESIGN.md "Measuring"):

* **tau** -- tokens committed per target forward pass, bonus token included, over all prompts:
  ``sum(new_tokens) / sum(target_forwards)``. Plain decoding has tau = 1 (the prefill forward
  gives the first token, each later forward one more).
* **tokens/s** -- ``sum(new_tokens) / sum(wall_time)`` of the timed ``generate`` calls.
* **speedup** -- median over prompts of ``tokens/s(method) / tokens/s(plain)`` on the same prompt, reported with
  the per-prompt range and middle half (`verdict.SpeedupSpread`), so one disturbed run cannot decide it; runs whose
  time per token is far above the same method's other prompts' are named as disturbed (`verdict.disturbed_runs`).
* **speculation's own share** -- the same median over prompts against ``engine`` (the engine with nothing drafted,
  `hf_speculative.bench.root_only`) instead of plain: what drafting adds on top of the engine's kernels. The speedup
  over plain is about the kernels' share (engine over plain) times this.
* **step overhead** -- ``(wall / target_forwards)(method) / (wall / new_tokens)(plain)``: how much
  longer one speculative step (draft + tree verification + bookkeeping) takes than one plain
  decoding step.  speedup ~= tau / step_overhead.
* **lossless rate** -- share of prompts whose greedy output token ids equal plain's, in the same dtype
  (``None`` when sampling: sampled outputs are equal in distribution only); in float32 it must be 1.
* **first divergence** -- on a prompt whose output differs from plain's, the index of the first differing new
  token; summarized as mean / min / max over the diverging prompts. In bfloat16/float16 read both against the
  numerics floor (`hf_speculative.bench.numerics`): how often plain ``generate()`` itself changes when the
  prompt runs in another batch shape.
"""

from __future__ import annotations

import gzip
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..paths import write_atomically
from ..plotting import save_figure
from .numerics import FLOOR_VARIANTS, divergence_summary, first_divergence
from .verdict import SpeedupSpread, disturbed_line, disturbed_runs

__all__ = [
    "Measurement",
    "speedup",
    "prompt_speedups",
    "disturbed",
    "speedup_lines",
    "step_overhead",
    "tau",
    "lossless_rate",
    "summarize_method",
    "summarize",
    "markdown_table",
    "floor_lines",
    "category_table",
    "plot_results",
    "write_json",
    "BASELINE",
    "ENGINE",
]

BASELINE = "plain"
#: the engine with nothing drafted: a method's tokens/s over its own is speculation's own share of the speedup
ENGINE = "engine"


@dataclass
class Measurement:
    """One method on one prompt.

    Attributes:
        wall_s: wall time of each repeat (seconds, the ``generate`` call only).
        target_forwards: target forward passes of the call (prefill included); ``None`` when unknown.
        accepted_lengths: tokens committed per target forward (our engine's stats), if any.
        output_ids: the new token ids (for the lossless check; not written to JSON).
        timings: the engine's time breakdown (draft / target / engine seconds), if any.
    """

    prompt_id: str
    category: str
    method: str
    new_tokens: int
    wall_s: list[float]
    target_forwards: int | None = None
    accepted_lengths: list[int] | None = None
    output_ids: list[int] | None = None
    timings: dict[str, float] | None = None
    prompt_tokens: int | None = None
    text: str | None = None

    @property
    def wall(self) -> float:
        """Median wall time over repeats."""
        return statistics.median(self.wall_s)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall if self.wall > 0 else float("nan")

    @property
    def tau(self) -> float | None:
        if self.target_forwards:
            return self.new_tokens / self.target_forwards
        return None


# ---------------------------------------------------------------------------- arithmetic


def tau(measurements: Sequence[Measurement]) -> float | None:
    """Tokens per target forward over all prompts; ``None`` if any forward count is unknown."""
    if not measurements or any(m.target_forwards is None for m in measurements):
        return None
    return sum(m.new_tokens for m in measurements) / sum(m.target_forwards for m in measurements)


def prompt_speedups(method: Sequence[Measurement], baseline: Sequence[Measurement]) -> SpeedupSpread | None:
    """Per-prompt ``tokens/s(method) / tokens/s(baseline)`` (prompts matched by id), or None when none matches."""
    base = {m.prompt_id: m for m in baseline}
    ratios = [
        m.tokens_per_s / base[m.prompt_id].tokens_per_s
        for m in method
        if m.prompt_id in base and base[m.prompt_id].tokens_per_s > 0 and m.new_tokens > 0
    ]
    return SpeedupSpread(tuple(ratios)) if ratios else None


def speedup(method: Sequence[Measurement], baseline: Sequence[Measurement]) -> float | None:
    """Median over prompts of tokens/s(method) / tokens/s(baseline) (prompts matched by id)."""
    spread = prompt_speedups(method, baseline)
    return spread.median if spread is not None else None


def disturbed(ms: Sequence[Measurement]) -> dict[str, float]:
    """``{prompt id: ratio}``: this method's runs whose seconds per token are far above its other prompts'."""
    return disturbed_runs({m.prompt_id: m.wall / m.new_tokens for m in ms if m.new_tokens > 0})


def step_overhead(method: Sequence[Measurement], baseline: Sequence[Measurement]) -> float | None:
    """(method wall time per target forward) / (baseline wall time per token)."""
    if any(m.target_forwards is None for m in method):
        return None
    fwd = sum(m.target_forwards for m in method)
    base_tokens = sum(m.new_tokens for m in baseline)
    if not fwd or not base_tokens:
        return None
    base_step = sum(m.wall for m in baseline) / base_tokens
    return (sum(m.wall for m in method) / fwd) / base_step


def lossless_rate(method: Sequence[Measurement], baseline: Sequence[Measurement], greedy: bool = True) -> float | None:
    """Share of prompts whose output ids equal the baseline's; ``None`` when sampling or ids missing."""
    if not greedy:
        return None
    base = {m.prompt_id: m.output_ids for m in baseline}
    pairs = [(m.output_ids, base.get(m.prompt_id)) for m in method]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if not pairs:
        return None
    return sum(a == b for a, b in pairs) / len(pairs)


def divergences(method: Sequence[Measurement], baseline: Sequence[Measurement]) -> dict[str, int | None]:
    """``{prompt id: first divergence from the baseline's output}`` (``None``: identical) where both have ids."""
    base = {m.prompt_id: m.output_ids for m in baseline}
    return {
        m.prompt_id: first_divergence(m.output_ids, base[m.prompt_id])
        for m in method
        if m.output_ids is not None and base.get(m.prompt_id) is not None
    }


def _tokens_per_s(ms: Sequence[Measurement]) -> float | None:
    wall = sum(m.wall for m in ms)
    return sum(m.new_tokens for m in ms) / wall if wall > 0 else None


def _repeat_spread(ms: Sequence[Measurement]) -> dict | None:
    """Median tokens/s over prompts, once per repeat, and its spread across repeats."""
    repeats = min(len(m.wall_s) for m in ms) if ms else 0
    if repeats < 2:
        return None
    medians = [statistics.median(m.new_tokens / m.wall_s[r] for m in ms if m.wall_s[r] > 0) for r in range(repeats)]
    mid = statistics.median(medians)
    return {
        "median_tokens_per_s_per_repeat": medians,
        "min": min(medians),
        "max": max(medians),
        "stdev": statistics.stdev(medians),
        "relative_spread": (max(medians) - min(medians)) / mid if mid else None,
    }


def summarize_method(
    ms: Sequence[Measurement],
    baseline: Sequence[Measurement] | None,
    greedy: bool = True,
    engine: Sequence[Measurement] | None = None,
) -> dict:
    """The JSON summary of one method (see the module docstring for the definitions); ``engine``: the runs of the
    engine with nothing drafted, for speculation's own share."""
    base = baseline or []
    out = {
        "tau": tau(ms),
        "tokens_per_s": _tokens_per_s(ms),
        "median_tokens_per_s": statistics.median(m.tokens_per_s for m in ms) if ms else None,
        "speedup": speedup(ms, base) if base else None,
        "speculation_share": speedup(ms, engine) if engine else None,
        "speedup_spread": _spread_dict(prompt_speedups(ms, base)) if base else None,
        "disturbed": disturbed(ms),
        "step_overhead": step_overhead(ms, base) if base else None,
        "lossless_rate": lossless_rate(ms, base, greedy) if base else None,
        **_divergence_fields(ms, base, greedy),
        "new_tokens": sum(m.new_tokens for m in ms),
        "wall_s": sum(m.wall for m in ms),
        "target_forwards": None if any(m.target_forwards is None for m in ms) else sum(m.target_forwards for m in ms),
        "n_prompts": len(ms),
        "repeats": _repeat_spread(ms),
    }
    timings = [m.timings for m in ms if m.timings]
    if timings:
        keys = sorted({k for t in timings for k in t})
        out["time_breakdown_s"] = {k: sum(t.get(k, 0.0) for t in timings) for k in keys}
    cats: dict[str, list[Measurement]] = {}
    for m in ms:
        cats.setdefault(m.category, []).append(m)
    out["per_category"] = {}
    for cat, cms in cats.items():
        ids = {m.prompt_id for m in cms}
        cbase = [b for b in base if b.prompt_id in ids]
        out["per_category"][cat] = {
            "tau": tau(cms),
            "speedup": speedup(cms, cbase) if cbase else None,
            "tokens_per_s": _tokens_per_s(cms),
        }
    return out


def _spread_dict(spread: SpeedupSpread | None) -> dict | None:
    return spread.as_dict() if spread is not None else None


def _divergence_fields(ms, base, greedy: bool) -> dict:
    """``first_divergence_mean/min/max`` over the prompts whose greedy output differs from the baseline's."""
    if not greedy or not base:
        return {}
    summary = divergence_summary(list(divergences(ms, base).values()))
    return {key: summary[key] for key in ("first_divergence_mean", "first_divergence_min", "first_divergence_max")}


def summarize(measurements: Iterable[Measurement], greedy: bool = True, baseline: str = BASELINE) -> dict[str, dict]:
    """``{method: summary}`` in the order methods first appear."""
    by_method: dict[str, list[Measurement]] = {}
    for m in measurements:
        by_method.setdefault(m.method, []).append(m)
    base, engine = by_method.get(baseline), by_method.get(ENGINE)
    # plain drafts nothing: no speculation's share (its tokens/s over the engine's is the kernels' share, inverted)
    return {
        name: summarize_method(ms, base, greedy, engine if name != baseline else None) for name, ms in by_method.items()
    }


def prompts_json(measurements: Iterable[Measurement], save_text: bool = False) -> list[dict]:
    """Per-prompt rows: ``{"id", "category", "prompt_tokens", "results": {method: {...}}}``."""
    rows: dict[str, dict] = {}
    base_ids = {}
    ms = list(measurements)
    for m in ms:
        if m.method == BASELINE:
            base_ids[m.prompt_id] = m.output_ids
    for m in ms:
        row = rows.setdefault(
            m.prompt_id, {"id": m.prompt_id, "category": m.category, "prompt_tokens": m.prompt_tokens, "results": {}}
        )
        res = {
            "new_tokens": m.new_tokens,
            "wall_s": m.wall,
            "tokens_per_s": m.tokens_per_s,
            "target_forwards": m.target_forwards,
            "tau": m.tau,
        }
        if len(m.wall_s) > 1:
            res["wall_s_repeats"] = m.wall_s
        if m.accepted_lengths is not None:
            res["accepted_lengths"] = m.accepted_lengths
        if m.prompt_id in base_ids and m.output_ids is not None and base_ids[m.prompt_id] is not None:
            res["matches_plain"] = m.output_ids == base_ids[m.prompt_id]
            res["first_divergence"] = first_divergence(m.output_ids, base_ids[m.prompt_id])
        if save_text and m.text is not None:
            res["text"] = m.text
        row["results"][m.method] = res
    return list(rows.values())


# ---------------------------------------------------------------------------- reports


def _fmt(x, spec=".2f", suffix="") -> str:
    if x is None:
        return "n/a"
    return f"{x:{spec}}{suffix}"


def _first_divergence_cell(s: dict) -> str:
    if s.get("first_divergence_min") is None:
        return "-" if s.get("lossless_rate") is not None else "n/a"
    return f"{s['first_divergence_mean']:.0f} / {s['first_divergence_min']}"


def markdown_table(methods: dict[str, dict]) -> str:
    """One row per method: tau, tokens/s, speedup, speculation's own share (over the engine with nothing drafted;
    n/a without that row), step overhead, identical-output rate against plain (same dtype) and the first divergence
    (mean / min new-token index over the prompts that differ)."""
    lines = [
        "| method | tau | tokens/s | speedup | speculation's share | step overhead | identical to plain | "
        "first divergence (mean / min) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in methods.items():
        lossless = None if s.get("lossless_rate") is None else 100 * s["lossless_rate"]
        lines.append(
            f"| {s.get('label') or name} | {_fmt(s.get('tau'))} | {_fmt(s.get('tokens_per_s'), '.1f')} | "
            f"{_fmt(s.get('speedup'), '.2f', 'x')} | {_fmt(s.get('speculation_share'), '.2f', 'x')} | "
            f"{_fmt(s.get('step_overhead'), '.2f', 'x')} | "
            f"{_fmt(lossless, '.0f', '%')} | {_first_divergence_cell(s)} |"
        )
    return "\n".join(lines)


def speedup_lines(methods: dict[str, dict], repeats: int = 1) -> str:
    """Each method's median speedup with its per-prompt spread, and a line naming disturbed runs, if any."""
    lines = [
        "speedup: median over prompts of tokens/s against plain on the same prompt (the verdict), per-prompt range"
    ]
    for name, s in methods.items():
        spread = s.get("speedup_spread")
        if spread and name != BASELINE:
            wide = "; the spread is wide: measure again with more --repeats" if spread["wide"] and repeats < 3 else ""
            share = (
                ""
                if s.get("speculation_share") is None or name == ENGINE
                else (f"; speculation's own share {s['speculation_share']:.2f}x over the engine with nothing drafted")
            )
            lines.append(
                f"  {name}: {spread['median']:.2f}x (median of {len(spread['per_prompt'])} prompts; per prompt "
                f"{spread['min']:.2f}-{spread['max']:.2f}x, middle half {spread['q1']:.2f}-{spread['q3']:.2f}x){share}{wide}"
            )
    line = disturbed_line({name: s["disturbed"] for name, s in methods.items() if s.get("disturbed")})
    return "\n".join(lines + ([line] if line else []))


FLOOR_LABELS = {
    "batch_of_two": "as one row of a batch of 2 identical rows",
    "split_prefill": "with its prefill split in two forwards",
    "any": "in both shapes",
}


def floor_lines(floor: dict) -> str:
    """The numerics floor (`hf_speculative.bench.numerics.summarize_floor`) as a few printed lines."""
    lines = ["numerics floor: plain greedy generate() on the same prompt in another batch shape"]
    for variant in (*FLOOR_VARIANTS, "any"):
        s = floor[variant]
        where = (
            ""
            if s["first_divergence_min"] is None
            else (f"; first divergence mean {s['first_divergence_mean']:.0f}, min {s['first_divergence_min']}")
        )
        lines.append(
            f"  {FLOOR_LABELS[variant]}: identical to batch-of-one on {s['identical']}/{s['n']} prompts{where}"
        )
    return "\n".join(lines)


def category_table(methods: dict[str, dict], key: str = "speedup") -> str:
    """Methods x categories of one per-category quantity (``speedup``, ``tau`` or ``tokens_per_s``)."""
    cats: list[str] = []
    for s in methods.values():
        for c in s.get("per_category", {}):
            if c not in cats:
                cats.append(c)
    lines = ["| method | " + " | ".join(cats) + " |", "|---|" + "---:|" * len(cats)]
    for name, s in methods.items():
        pc = s.get("per_category", {})
        lines.append(f"| {name} | " + " | ".join(_fmt(pc.get(c, {}).get(key)) for c in cats) + " |")
    return "\n".join(lines)


def plot_results(methods: dict[str, dict], path: str | Path, title: str | None = None) -> Path:
    """Grouped bars of speedup (top) and tau (bottom) per category per method; PNG via matplotlib Agg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cats: list[str] = []
    for s in methods.values():
        for c in s.get("per_category", {}):
            if c not in cats:
                cats.append(c)
    groups = cats + ["overall"]
    names = list(methods)
    x = np.arange(len(groups))
    width = 0.8 / max(len(names), 1)
    fig, axes = plt.subplots(2, 1, figsize=(max(9, 1.1 * len(groups) + 4), 7.5), sharex=True)
    for ax, key, label in (
        (axes[0], "speedup", "speedup vs plain (x)"),
        (axes[1], "tau", "tau (tokens / target forward)"),
    ):
        for i, name in enumerate(names):
            s = methods[name]
            vals = [s.get("per_category", {}).get(c, {}).get(key) for c in cats] + [s.get(key)]
            vals = [np.nan if v is None else v for v in vals]
            ax.bar(x + (i - (len(names) - 1) / 2) * width, vals, width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(groups, rotation=30, ha="right")
    if title:
        axes[0].set_title(title, fontsize=10)
    return save_figure(fig, path)


def write_json(result: dict, path: str | Path) -> Path:
    """A bench record as indented JSON; gzipped when ``path`` ends in ``.gz`` (the form the docs keep records in)."""
    path = Path(path)
    text = json.dumps(result, indent=2, default=str) + "\n"
    write_atomically(path, gzip.compress(text.encode("utf-8"), mtime=0) if path.suffix == ".gz" else text)
    return path


def beside_record(path: str | Path, suffix: str) -> Path:
    """The file next to a record ``x.json`` or ``x.json.gz`` with ``suffix`` instead (``x.md``, ``x.png``)."""
    path = Path(path)
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    return path.with_name(stem + suffix)


def read_json(path: str | Path) -> dict:
    """A bench record `write_json` wrote, gzipped or not."""
    path = Path(path)
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
