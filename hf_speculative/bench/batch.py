"""Batched throughput: total new tokens/s of each method against plain batched ``generate()`` on the same batches.

``hf-speculative bench --batch-size 1,4,8,16`` groups the prompts into batches of B (left padded, with an
attention mask, in prompt order), and times per batch every method, plain first, in the same process. A
row's new tokens are its generated tokens up to and including its first EOS (the padding after it is not
counted). Per method and B: total new tokens over total seconds, the speedup over plain, speculation's own share
(tokens/s over the engine with nothing drafted, ``engine``, when it runs), tau per row
(the mean over rows of each row's tokens per target forward it took part in) and the share of rows whose
tokens equal plain's (lossless rate, greedy). `plot_batch_speedup` draws speedup against B.

With ``repeats`` > 1 every batch is decoded that many times per method, in rounds (plain first in the first round,
whose outputs are the ones compared; the order reversed in every other round, so a drift of the machine's speed
falls on all methods alike), and a method's time on a batch is the median of its rounds. A method whose drafter
learns across calls (`TreeDrafter.learns_across_calls`: Token Recycling, SuffixDecoding, hybrids with them) runs in the
first round only: in a later one it would draft from the answer it saw in the first.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from .harness import (
    BenchOptions,
    baselines_first,
    build_methods,
    generate_kwargs,
    learns_across_calls,
    machine_info,
    synchronize,
)
from .prompts import prepare_prompts

__all__ = ["run_batch_benchmark", "batch_table", "plot_batch_speedup", "pad_batch", "BATCH_UNSUPPORTED"]

#: transformers' assisted generation and prompt lookup take one sequence
BATCH_UNSUPPORTED = ("hf-assisted", "hf-prompt-lookup")


def pad_batch(prompts, pad_token_id: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Left-pad the prompts' ``input_ids`` ``(1, L_i)`` into one batch; returns ids and attention mask."""
    width = max(p.input_ids.shape[1] for p in prompts)
    ids, mask = [], []
    for p in prompts:
        row = p.input_ids[0]
        pad = width - row.shape[0]
        ids.append(torch.cat([row.new_full((pad,), pad_token_id), row]))
        mask.append(torch.cat([row.new_zeros(pad), torch.ones_like(row)]))
    return torch.stack(ids), torch.stack(mask)


def _row_tokens(sequences: torch.LongTensor, prompt_width: int, eos) -> list[list[int]]:
    """Each row's generated tokens up to and including its first EOS."""
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else []))
    rows = []
    for row in sequences[:, prompt_width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        rows.append(row[:end])
    return rows


def _row_taus(output, batch_size: int) -> list[float] | None:
    stats = getattr(output, "speculative_stats", None)
    if stats is None:
        return None
    rows = stats.rows if stats.rows else [stats]
    return [r.mean_accepted_length for r in rows][:batch_size]


def _row_verified_tokens(output, batch_size: int) -> list[int]:
    """Tokens each row carried into each verification forward (its tree's nodes plus the root), over all steps."""
    stats = getattr(output, "speculative_stats", None)
    if stats is None:
        return []
    rows = stats.rows if stats.rows else [stats]
    return [n for r in rows[:batch_size] for n in r.tree_sizes]


def _tree_nodes(method, batch_size: int) -> int | None:
    tree_for_batch = getattr(method, "tree_for_batch", None)
    tree = tree_for_batch(batch_size) if tree_for_batch is not None else None
    return getattr(tree, "num_nodes", None)


def _run_group(bench_methods, per_method: dict, ids, mask, common: dict, device, seed_value: int | None, bar) -> None:
    """Each method on one padded batch, in as many rounds as its ``per_method[name]["round_seconds"]`` has entries
    (see the module docstring), accumulated in ``per_method``; the first round's rows (plain's the reference) are the
    ones measured."""
    repeats = max(len(acc["round_seconds"]) for acc in per_method.values())
    seconds: dict[str, list[float]] = {m.name: [] for m in bench_methods}
    reference = None
    for round_ in range(repeats):
        for m in bench_methods if round_ % 2 == 0 else bench_methods[::-1]:
            if round_ >= len(per_method[m.name]["round_seconds"]):
                continue
            out, dt = _timed_generate(m, ids, mask, common, device, seed_value)
            seconds[m.name].append(dt)
            per_method[m.name]["round_seconds"][round_] += dt
            bar.update(1)
            if round_ == 0:
                rows = _row_tokens(out.sequences, ids.shape[1], common["eos_token_id"])
                reference = rows if reference is None else reference
                _count_rows(per_method[m.name], out, rows, reference)
    for name, values in seconds.items():
        per_method[name]["seconds"] += statistics.median(values)


def _timed_generate(m, ids, mask, common: dict, device, seed_value: int | None):
    """One batched ``generate`` of method ``m`` and its wall time."""
    if seed_value is not None:
        torch.manual_seed(seed_value)
    synchronize(device)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = m.generate(ids, mask, **common)
        synchronize(device)
        return out, time.perf_counter() - t0


def _count_rows(acc: dict, out, rows: list[list[int]], reference: list[list[int]]) -> None:
    """A method's new tokens, taus, verified tokens and rows equal to plain's on one batch."""
    acc["tokens"] += sum(len(r) for r in rows)
    acc["rows"] += len(rows)
    taus = _row_taus(out, len(rows))
    if taus is not None:
        acc["taus"].extend(taus)
    acc["verified"].extend(_row_verified_tokens(out, len(rows)))
    acc["exact_rows"] += sum(r == ref for r, ref in zip(rows, reference))


def _accumulator(rounds: int) -> dict[str, Any]:
    """What one method gathers over a batch size's batches, timed in ``rounds`` rounds."""
    return {
        "seconds": 0.0,
        "round_seconds": [0.0] * rounds,
        "tokens": 0,
        "taus": [],
        "rows": 0,
        "exact_rows": 0,
        "verified": [],
    }


def _size_results(per_method: dict, bench_methods, batch_size: int, greedy: bool) -> dict[str, Any]:
    """One batch size's JSON entry per method from its accumulated timings and rows."""
    tokens_per_s = {name: acc["tokens"] / max(acc["seconds"], 1e-9) for name, acc in per_method.items()}
    engine_tps = tokens_per_s.get("engine")
    return {
        name: {
            "label": method.label or name,
            "tokens_per_s": tokens_per_s[name],
            "speedup": tokens_per_s[name] / tokens_per_s["plain"],
            "speculation_share": tokens_per_s[name] / engine_tps if engine_tps and name != "plain" else None,
            "new_tokens": acc["tokens"],
            "seconds": acc["seconds"],
            # every round's total seconds over all batches (the spread behind the medians when repeats > 1)
            "round_seconds": acc["round_seconds"],
            "tau_per_row": acc["taus"] or None,
            "tau": sum(acc["taus"]) / len(acc["taus"]) if acc["taus"] else None,
            "lossless_rate": acc["exact_rows"] / max(acc["rows"], 1) if greedy else None,
            "tree_nodes": _tree_nodes(method, batch_size),
            # what a row's verification forwards really carried (a prompt-lookup trie fills only part of its tree)
            "verified_tokens_per_row": sum(acc["verified"]) / len(acc["verified"]) if acc["verified"] else None,
        }
        for (name, acc), method in zip(per_method.items(), bench_methods)
    }


def run_batch_benchmark(
    model,
    tokenizer,
    records,
    methods: list[str],
    batch_sizes: list[int],
    options: BenchOptions | None = None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    device=None,
    progress: bool = True,
    repeats: int = 1,
) -> dict[str, Any]:
    """Time ``methods`` on ``records`` in batches of each size in ``batch_sizes`` (each ``repeats`` times, the median
    counted); the JSON-ready result."""
    from tqdm.auto import tqdm

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    options = options or BenchOptions()
    device = device or model.device
    methods = baselines_first(["plain"] + [m for m in methods if m != "plain" and m not in BATCH_UNSUPPORTED])
    model.eval()
    bench_methods = build_methods(methods, model, tokenizer, options)
    prompts = prepare_prompts(records, tokenizer, device=device)
    common = generate_kwargs(model, tokenizer, max_new_tokens, temperature)
    pad = common["pad_token_id"] if common["pad_token_id"] is not None else 0
    common["pad_token_id"] = pad
    greedy = temperature <= 0
    warm_ids, warm_mask = pad_batch(prompts[: min(2, len(prompts))], pad)
    for m in bench_methods:  # warm-up
        with torch.inference_mode():
            m.generate(warm_ids, warm_mask, **{**common, "max_new_tokens": min(8, max_new_tokens)})

    results: dict[str, Any] = {}
    rounds = {m.name: 1 if learns_across_calls(m) else repeats for m in bench_methods}
    total = sum((len(prompts) + b - 1) // b for b in batch_sizes) * sum(rounds.values())
    bar = tqdm(total=total, desc="batch bench", unit="batch", disable=not progress)
    for b in batch_sizes:
        per_method = {name: _accumulator(n) for name, n in rounds.items()}
        for start in range(0, len(prompts), b):
            group = prompts[start : start + b]
            ids, mask = pad_batch(group, pad)
            seed_value = seed + start if seed is not None and not greedy else None
            _run_group(bench_methods, per_method, ids, mask, common, device, seed_value, bar)
        results[str(b)] = _size_results(per_method, bench_methods, b, greedy)
    bar.close()
    setting = _setting(bench_methods, batch_sizes, max_new_tokens, temperature, len(prompts), repeats, device)
    return {"setting": setting, "batches": results}


def _setting(bench_methods, batch_sizes, max_new_tokens, temperature, n_prompts, repeats, device) -> dict[str, Any]:
    """The run's ``setting`` entry: what was decoded, how, on which machine."""
    return {
        "batch_sizes": batch_sizes,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "n_prompts": n_prompts,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "machine": machine_info(device),
        "methods": {m.name: {"description": m.description, **m.settings()} for m in bench_methods},
        "timing": (
            "time.perf_counter around each batched generate call; prompts left padded, methods interleaved per "
            "batch; a method's time on a batch is the median of its repeats (rounds in alternating order)"
        ),
    }


def batch_table(result: dict[str, Any]) -> str:
    """Markdown: total new tokens/s, speedup, speculation's own share (over the engine with nothing drafted), tau and
    lossless rate per method and batch size."""
    lines = [
        "| B | method | tree nodes | new tokens/s | speedup | speculation's share | tau (mean per row) | lossless rows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b, methods in result["batches"].items():
        for name, s in methods.items():
            tau = f"{s['tau']:.2f}" if s["tau"] is not None else "-"
            lossless = f"{100 * s['lossless_rate']:.0f}%" if s["lossless_rate"] is not None else "-"
            nodes = s.get("tree_nodes") if s.get("tree_nodes") is not None else "-"
            share = f"{s['speculation_share']:.2f}x" if s.get("speculation_share") is not None else "-"
            lines.append(
                f"| {b} | {s.get('label') or name} | {nodes} | {s['tokens_per_s']:.2f} | {s['speedup']:.2f}x | {share} | "
                f"{tau} | {lossless} |"
            )
    return "\n".join(lines)


def plot_batch_speedup(result: dict[str, Any], path, title: str | None = None):
    """Speedup over plain batched generate against batch size, one line per method (PNG, matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [int(b) for b in result["batches"]]
    names = [n for n in next(iter(result["batches"].values())) if n != "plain"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in names:
        ax.plot(sizes, [result["batches"][str(b)][name]["speedup"] for b in sizes], marker="o", label=name)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(b) for b in sizes])
    ax.set_xlabel("batch size B")
    ax.set_ylabel("speedup vs plain batched generate (x)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
