"""Engine A/B: the same decoding with two commits of hf_speculative, alternated per prompt in one run.

Two worker processes, one per commit (each imports its own checkout and loads the reference model once), take the
prompts in turn: for each held-out prompt, the old commit's worker decodes it (plain ``generate()``, the engine with
nothing drafted, tree prompt lookup, Token Recycling, SuffixDecoding), then the new commit's, so both see the same
machine state; which commit goes first alternates per prompt, and ``--rounds`` repeats the whole set (the report
gives each method's tokens/s per round and their median). Each reports wall time,
tokens, target forwards and the engine's own seconds (``speculative_stats.timings["engine"]``: masks, acceptance,
cache compaction, bookkeeping; the LM head counts as the target's).

    python scripts/engine_ab.py --old /path/to/old/checkout --new . --limit 8 --max-new-tokens 96 --rounds 3 --output out.json

Each worker reports its peak resident memory (VmHWM) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKER = r"""
import json, os, sys, time
import torch
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
import hf_speculative as hfs
from hf_speculative.bench.reference import load_reference_model
model, tokenizer = load_reference_model()
hfs.enable(model)
recycling = hfs.TokenRecyclingDrafter()


class RootOnly(hfs.TreeDrafter):  # the engine with nothing drafted: every draft is the root alone
    default_tree = hfs.TreeSpec.chain(1)

    def begin_batch(self, prompts, target_outputs):
        pass

    def propose_batch(self, sequences, rows, tree, options):
        return [hfs.DraftTree(tokens=s[0, -1:].clone(), parents=(-1,)) for s in sequences]

    def advance_batch(self, sequences, rows, drafts, results, target_outputs):
        pass


methods = {"plain": None, "engine": RootOnly(), "tree-prompt-lookup": hfs.PromptLookupDrafter(),
           "token-recycling": recycling, "suffix": hfs.SuffixDrafter()}
print(json.dumps({"ready": hfs.__file__}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    if job.get("memory"):
        print(json.dumps({"peak_kb": int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1])}), flush=True)
        continue
    ids = torch.tensor([job["ids"]])
    out = {}
    for name, drafter in methods.items():
        if name not in job["methods"]:
            continue
        kwargs = {} if drafter is None else {"assistant_model": drafter, "return_dict_in_generate": True}
        if name == "engine":
            kwargs["speculative_pricing"] = False
        start = time.perf_counter()
        result = model.generate(ids, max_new_tokens=job["max_new_tokens"], do_sample=False, **kwargs)
        seconds = time.perf_counter() - start
        sequences = result if drafter is None else result.sequences
        row = {"seconds": seconds, "tokens": sequences.shape[1] - ids.shape[1], "output": sequences[0].tolist()}
        if drafter is not None:
            stats = result.speculative_stats
            row.update(steps=stats.num_target_forwards - 1, engine=stats.timings["engine"], draft=stats.timings["draft"],
                       target=stats.timings["target"])
        out[name] = row
    print(json.dumps(out), flush=True)
"""


def _worker(checkout: str, threads: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout), "THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.abspath(checkout),
    )
    ready = json.loads(proc.stdout.readline())
    print(f"worker {checkout}: {ready['ready']}", file=sys.stderr)
    return proc


def _ask(proc: subprocess.Popen, ids: list[int], max_new_tokens: int, methods: list[str]) -> dict:
    proc.stdin.write(json.dumps({"ids": ids, "max_new_tokens": max_new_tokens, "methods": methods}) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


METHODS = ("plain", "engine", "tree-prompt-lookup", "token-recycling", "suffix")


def _summary(runs: list[dict], method: str, rounds: int) -> dict:
    rows = [r[method] for r in runs]
    per_round = len(rows) // rounds
    round_tps = [
        sum(r["tokens"] for r in rows[k * per_round : (k + 1) * per_round])
        / sum(r["seconds"] for r in rows[k * per_round : (k + 1) * per_round])
        for k in range(rounds)
    ]
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    out = {
        "tokens_per_second": round(tokens / seconds, 2),
        "rounds_tokens_per_second": [round(t, 2) for t in round_tps],
        "median_round_tokens_per_second": round(statistics.median(round_tps), 2),
    }
    if "steps" in rows[0]:
        steps = sum(r["steps"] for r in rows)
        out.update(
            tau=round(tokens / max(sum(r["steps"] for r in rows) + len(rows), 1), 3),
            engine_ms_per_step=round(1000 * sum(r["engine"] for r in rows) / max(steps, 1), 3),
            draft_ms_per_step=round(1000 * sum(r["draft"] for r in rows) / max(steps, 1), 3),
            target_ms_per_step=round(1000 * sum(r["target"] for r in rows) / max(steps, 1), 3),
            median_prompt_seconds=round(statistics.median(r["seconds"] for r in rows), 3),
        )
    return out


def _machine() -> str:
    from pathlib import Path

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown CPU")
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in info]
    return f"{name} ({', '.join(flags)})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="checkout of the old commit")
    p.add_argument("--new", default=".", help="checkout of the new commit")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1, help="passes over the prompts (the report gives their median)")
    p.add_argument("--output", default=None)
    p.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)} (default: all)"
    )
    args = p.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")

    sys.path.insert(0, os.path.abspath(args.new))
    from hf_speculative.bench.prompts import load_prompts, prepare_prompts, spread_over_categories
    from hf_speculative.bench.reference import load_reference_model

    _, tokenizer = load_reference_model()
    prompts = prepare_prompts(spread_over_categories(load_prompts("heldout"), args.limit), tokenizer)
    workers = {"old": _worker(args.old, args.threads), "new": _worker(args.new, args.threads)}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    start = time.perf_counter()
    for k in range(args.rounds):
        for i, prompt in enumerate(prompts):
            for name in ("old", "new") if (i + k) % 2 == 0 else ("new", "old"):  # alternate which commit goes first
                runs[name].append(_ask(workers[name], prompt.input_ids[0].tolist(), args.max_new_tokens, methods))
            print(
                f"round {k + 1}/{args.rounds}, prompt {i + 1}/{len(prompts)} ({time.perf_counter() - start:.0f} s)",
                file=sys.stderr,
            )
    peak = {}
    for name, proc in workers.items():
        proc.stdin.write(json.dumps({"memory": True}) + "\n")
        proc.stdin.flush()
        peak[name] = json.loads(proc.stdout.readline())["peak_kb"]
    for proc in workers.values():
        proc.stdin.close()
        proc.wait()
    identical = all(
        runs["old"][i][m]["output"] == runs["new"][i][m]["output"] == runs["new"][i]["plain"]["output"]
        for i in range(len(runs["new"]))
        for m in methods
    )
    report = {
        "old": os.path.abspath(args.old),
        "new": os.path.abspath(args.new),
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "rounds": args.rounds,
        "identical_outputs": identical,
        "peak_resident_kb": peak,
        "machine": _machine(),
        "methods": {m: {name: _summary(runs[name], m, args.rounds) for name in runs} for m in methods},
    }
    text = json.dumps(report, indent=1)
    if args.output:
        from hf_speculative.bench.report import write_json

        write_json(report, args.output)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
