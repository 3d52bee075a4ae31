"""Re-run every committed downstream row and compare it with its JSON in docs/results/downstream/.

Each row's JSON records the ``eval`` command that made it (``run_downstream.py eval``, recorded as
``hf-speculative downstream eval`` by the rows made before the study left the package); this script runs that command again (from the
repository root, writing to a scratch folder, no card) and checks that the deterministic fields match: n, tau,
target forwards, new tokens, lossless rate, task metric, extra parameters. Speedup is a wall-time ratio and is
reported beside the recorded one, not compared.

    python benchmarks/reproduce_downstream.py [--results docs/results/downstream_longer] [--only e2e_nlg_lora,wikisql_lora]
        [--out DIR] [--report FILE.md]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = ROOT / "docs" / "results" / "downstream"
EXACT = ("n", "tau", "target_forwards", "new_tokens", "lossless_rate", "metric", "extra_parameters")


def rerun(record: dict, out: Path) -> dict:
    argv = shlex.split(record["command"])
    prefixes = (["hf-speculative", "downstream", "eval"], ["python", "benchmarks/run_downstream.py", "eval"])
    prefix = next((p for p in prefixes if argv[: len(p)] == p), None)
    assert prefix is not None, record["command"]
    argv = argv[len(prefix) - 1 :]  # from "eval" on
    argv = [a for a in argv if a != "--write-card"]
    if "--output" in argv:
        i = argv.index("--output")
        del argv[i : i + 2]
    cmd = [sys.executable, str(HERE / "run_downstream.py"), *argv, "--output", str(out), "--no-progress"]
    subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="folder of eval JSONs (default: docs/results/downstream)"
    )
    parser.add_argument("--only", default=None, help="comma-separated JSON names (without .json)")
    parser.add_argument("--out", default=None, help="keep the new JSONs here (default: a temporary folder)")
    parser.add_argument("--report", default=None, help="also write the comparison as markdown here")
    args = parser.parse_args()
    names = sorted(p.stem for p in args.results.glob("*.json"))
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="reproduce-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "| row | folder | tau recorded / now | lossless | metric | speedup recorded / now | reproduced |",
        "|---|---|---|---|---|---|---|",
    ]
    failed = []
    for name in names:
        record = json.loads((args.results / f"{name}.json").read_text())
        if not record.get("folder", "").startswith("model_cards/"):
            continue
        now = rerun(record, out_dir / f"{name}.json")
        diffs = [k for k in EXACT if record.get(k) != now.get(k)]
        ok = not diffs
        failed += [] if ok else [name]
        lines.append(
            f"| {name} | `{record['folder']}` | {record['tau']:.4f} / {now['tau']:.4f} | {now['lossless_rate']:.2f} "
            f"| {now['metric']} | {record['speedup']:.2f}x / {now['speedup']:.2f}x | {'yes' if ok else 'no: ' + ', '.join(diffs)} |"
        )
        print(lines[-1], flush=True)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.report:
        Path(args.report).write_text(report)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
