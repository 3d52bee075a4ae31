"""What the kit writes back: ``results.json`` (every step and every measurement), ``results.md`` (the tables, the
machine named) and the trained drafters as safetensors shards (`bundle.write_bundle`)."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from bundle import write_bundle


def machine() -> dict:
    """The device, torch and transformers the numbers were measured with."""
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "device": gpu or f"cpu ({platform.processor() or platform.machine()})",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def bench_table(data: dict) -> list[str]:
    """Markdown rows of one batch-1 ``bench`` JSON: method, tau, tokens/s, speedup, identical to plain."""
    rows = ["| method | tau | tokens/s | speedup | identical to plain |", "|---|---:|---:|---:|---:|"]
    for name, m in data["methods"].items():
        rows.append(
            f"| {name} | {_fmt(m.get('tau'), '.2f')} | {_fmt(m.get('tokens_per_s'), '.1f')} | "
            f"{_fmt(m.get('speedup'), '.2f')}x | {_fmt(100 * m.get('lossless_rate', 0), '.0f')}% |"
        )
    return rows


def batch_table(data: dict) -> list[str]:
    """Markdown rows of one batched ``bench`` JSON: batch size, method, total tokens/s, speedup, tau per row."""
    rows = ["| batch | method | tokens/s | speedup | tau | identical to plain |", "|---:|---|---:|---:|---:|---:|"]
    for batch, methods in data["batches"].items():
        for name, m in methods.items():
            rows.append(
                f"| {batch} | {name} | {_fmt(m.get('tokens_per_s'), '.1f')} | {_fmt(m.get('speedup'), '.2f')}x | "
                f"{_fmt(m.get('tau'), '.2f')} | {_fmt(100 * (m.get('lossless_rate') or 0), '.0f')}% |"
            )
    return rows


def downstream_table(arms: dict) -> list[str]:
    """Markdown rows of the ``downstream eval`` JSONs: arm, tau, speedup over its own plain decoding, metric."""
    rows = ["| arm (E2E NLG) | tau | speedup | metric | lossless |", "|---|---:|---:|---|---:|"]
    for name, r in arms.items():
        rows.append(
            f"| {name} | {_fmt(r.get('tau'), '.2f')} | {_fmt(r.get('speedup'), '.2f')}x | "
            f"{r.get('metric')} | {_fmt(r.get('lossless_rate'), '.2f')} |"
        )
    return rows


def _note(step: dict) -> str:
    """A step's error or skip reason, the arms it skipped, else nothing (``|`` kept out of the table)."""
    note = step.get("error") or "; ".join(f"skipped {k}: {v}" for k, v in (step.get("skipped") or {}).items())
    return note.replace("|", "/")


def markdown(results: dict) -> str:
    """``results.md``: the machine, each step's time, then one table per measurement."""
    m = results["machine"]
    lines = [
        f"# GPU kit run: {m['device']}",
        "",
        f"{m['date']}, torch {m['torch']}, transformers {m['transformers']}, {results['minutes']} minutes budget"
        f"{' (smoke run: a tiny random model, numbers mean nothing)' if results['smoke'] else ''}.",
        "",
        "| step | status | seconds | note |",
        "|---|---|---:|---|",
    ]
    lines += [
        f"| {s['step']} | {s.get('status', 'ok')} | {s.get('seconds', '-')} | {_note(s)} |" for s in results["steps"]
    ]
    for name, data in results["bench"].items():
        setting = data.get("setting", {})
        partial = f", partial: the first {setting.get('n_prompts')} prompts" if setting.get("partial") else ""
        lines += [
            "",
            f"## {name} ({results['dtype']}, greedy, {setting.get('max_new_tokens', '?')} new tokens{partial})",
            "",
        ]
        lines += batch_table(data) if "batches" in data else bench_table(data)
    if results["downstream"]:
        lines += ["", "## E2E NLG arms (downstream eval)", "", *downstream_table(results["downstream"])]
    return "\n".join(lines) + "\n"


def write_report(run) -> list[Path]:
    """Write ``results.json``, ``results.md`` and the drafter bundle into ``run.out``; returns the files."""
    results = {
        "machine": machine(),
        "smoke": run.smoke,
        "dtype": run.pick("bfloat16", "float32"),
        "minutes": run.minutes,
        "steps": run.steps,
        **run.results,
    }
    files = []
    if run.drafters.is_dir() and any(run.drafters.iterdir()):
        try:
            files += write_bundle(run.drafters, run.out)
            results["drafter_files"] = [f.name for f in files]
        except (OSError, ValueError) as err:  # the measurements still come back
            results["drafter_files_error"] = f"{type(err).__name__}: {err}"
    (run.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (run.out / "results.md").write_text(markdown(results))
    return [run.out / "results.json", run.out / "results.md", *files]
