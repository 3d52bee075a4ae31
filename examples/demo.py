"""Demo: SmolLM2-135M-Instruct answers chat prompts with and without tree speculative decoding.

    python examples/demo.py [--prompts mt_bench] [--limit 6] [--max-new-tokens 128] [--threads 2] [--drafter NAME|FOLDER,...]
                            [--dtype float32|bfloat16|float16]

For each prompt the demo runs plain greedy `generate()` and `generate(assistant_model=drafter)` for each drafter in this process
and prints each result as soon as it is measured: tokens/s of both, tau (tokens committed per target forward),
the speedup, and whether the two outputs are identical (in float32 they must be: greedy tree decoding is
lossless). Beside them runs the engine with nothing drafted (every step a one-token step through the engine's kernels,
`hf_speculative.bench.root_only`): a drafter's tokens/s over the engine's is speculation's own share of its speedup,
the rest is the kernels'. It ends with one verdict line per drafter: the median of the per-prompt speedups with their
range, so one disturbed run cannot decide it. Timings are wall-clock: a prompt whose time per token is far above the others' is
re-measured once, and the demo says so.

``--dtype bfloat16`` (or ``float16``): a forward over many tokens does not round like one-token forwards, so an
output may leave plain decoding's by rounding. The demo then also runs plain ``generate()`` with the prompt as
one row of a batch of two identical rows (the numerics floor: plain decoding's own batch-shape noise) and shows
where each output first differs.

``--prompts``: a built-in prompt set (``mt_bench``, the default; ``heldout``, ``alpaca``, ... see
``hf_speculative/bench/data/README.md``) or a prompt file; ``--limit`` prompts are taken evenly across it.
``--drafter``: a comma list of ``prompt-lookup`` (the model-free n-gram tree drafter), ``token-recycling``,
``hybrid`` (prompt lookup and Token Recycling in one tree), ``medusa`` (the trained
reference Medusa heads committed in `model_cards/`) or drafter folders (any hf_speculative drafter or small causal
LM); the default shows tree prompt lookup (the fastest measured) beside the training-free hybrid tree.
"""

from __future__ import annotations

import os

# The one-time GGUF conversion and weight loading draw carriage-return progress bars; the demo reports itself.
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_speculative as hfs  # noqa: E402
from hf_speculative.bench import describe_prompts, load_prompts, load_reference_model, prepare_prompts  # noqa: E402
from hf_speculative.bench.numerics import first_divergence  # noqa: E402
from hf_speculative.bench.reference import reference_cache_path  # noqa: E402
from hf_speculative.bench.root_only import ENGINE_CALL, ENGINE_LABEL, RootOnlyDrafter  # noqa: E402
from hf_speculative.bench.verdict import SpeedupSpread, disturbed_line, disturbed_runs, speedup_verdict  # noqa: E402
from hf_speculative.hub import resolve_name_or_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEADS = ROOT / "model_cards" / "medusa-smollm2-135m-instruct"

#: The demo's drafters, when --drafter is not given: a comma list of "prompt-lookup" | "token-recycling" | "hybrid" |
#: "medusa" | a drafter folder. The defaults: tree prompt lookup, the fastest drafter on the held-out prompts (1.08x)
#: and on MT-Bench (1.31x) in docs/results/2026-11-25-token-recycling.md (2-core AMD EPYC, fp32), and the
#: training-free hybrid of prompt lookup and Token Recycling (0.98x / 1.20x there).
DEFAULT_DRAFTER = "prompt-lookup,hybrid"


def load_drafter(name: str, model):
    """``(drafter, description)`` for ``--drafter``; a folder that does not exist raises (no silent fallback)."""
    if name == "prompt-lookup":
        return hfs.PromptLookupDrafter(), (
            "n-gram tree drafter (prompt lookup: no draft model, 16-node budget; the fastest "
            "drafter measured on the held-out prompts, docs/results/2026-11-25-token-recycling.md)"
        )
    if name == "token-recycling":
        return (
            hfs.TokenRecyclingDrafter(),
            "Token Recycling (the target's verified top-k successors; no draft model, learns as it runs)",
        )
    if name == "hybrid":
        parts = [hfs.PromptLookupDrafter(), hfs.TokenRecyclingDrafter()]
        return hfs.HybridDrafter(parts), "one tree merged from prompt lookup and Token Recycling (no draft model)"
    if name == "medusa":
        heads = hfs.MedusaHeadsModel.from_pretrained(HEADS, base_model=model)
        vocab = f", {heads.config.draft_vocab_size}-token draft vocabulary" if heads.config.draft_vocab_size else ""
        return (
            heads,
            f"Medusa heads from {HEADS.relative_to(ROOT)} ({heads.config.num_heads} heads{vocab}, cost-aware tree)",
        )
    from hf_speculative.bench.harness import load_drafter as load_drafter_folder

    drafter = load_drafter_folder(name, model)
    return drafter, f"{type(drafter).__name__} from {name}"


def with_engine(drafters: dict) -> dict:
    """The engine with nothing drafted (`ENGINE_LABEL`) first, then ``drafters``: the row speculation's share is read
    against."""
    engine = (
        RootOnlyDrafter(),
        "no candidates: every step a one-token step through the engine's kernels (each drafter's "
        "speculation's share is its speed over this one's)",
    )
    return {ENGINE_LABEL: drafters.get(ENGINE_LABEL, engine), **drafters}


def speculation_share(run: "PromptRun", name: str) -> float:
    """A drafter's tokens/s over the engine's with nothing drafted, on one prompt (the same tokens: a time ratio)."""
    return run.seconds[ENGINE_LABEL] / run.seconds[name]


def spread(records, n: int):
    """``n`` records taken evenly across the set (one every len/n), so every category shows up."""
    step = max(1, len(records) // max(1, n))
    return records[::step][:n]


def say(text: str = "") -> None:
    print(text, flush=True)


@dataclass
class PromptRun:
    """One prompt's timed runs: plain ``generate()`` and each drafter, alternated in this order."""

    plain: torch.Tensor
    plain_s: float
    new_tokens: int
    seconds: dict = field(default_factory=dict)  # drafter name -> seconds
    forwards: dict = field(default_factory=dict)  # drafter name -> target forwards
    outputs: dict = field(default_factory=dict)  # drafter name -> sequences
    floor_moved: int | None = None  # bf16/fp16: where plain as a row of a batch of two first differs


def plain_generate(model, ids, common: dict) -> torch.Tensor:
    """Plain decoding: transformers' own generate(), without the tree loop."""
    return transformers.GenerationMixin.generate(model, ids, **common)


def measure_prompt(model, ids, drafters: dict, common: dict, exact: bool) -> PromptRun:
    """Plain generate(), then each drafter on the same prompt (alternating, so slow minutes hit all alike)."""
    start = time.perf_counter()
    plain = plain_generate(model, ids, common)
    run = PromptRun(plain, time.perf_counter() - start, plain.shape[1] - ids.shape[1])
    if not exact:  # the numerics floor: plain decoding of the same prompt as one row of a batch of two
        two = plain_generate(model, ids.expand(2, -1), common)
        run.floor_moved = first_divergence(
            two[0, ids.shape[1] : plain.shape[1]].tolist(), plain[0, ids.shape[1] :].tolist()
        )
    for name, (drafter, _) in drafters.items():
        extra = ENGINE_CALL if isinstance(drafter, RootOnlyDrafter) else {}
        start = time.perf_counter()
        out = model.generate(ids, assistant_model=drafter, return_dict_in_generate=True, **extra, **common)
        run.seconds[name] = time.perf_counter() - start
        run.forwards[name] = len(out.speculative_stats.accepted_lengths)
        run.outputs[name] = out.sequences
    return run


def identity_text(run: PromptRun, name: str, ids, exact: bool, dtype: str) -> str:
    if torch.equal(run.plain, run.outputs[name]):
        return "yes, identical output"
    if exact:
        return "NO, OUTPUT DIFFERS"
    moved = first_divergence(run.outputs[name][0, ids.shape[1] :].tolist(), run.plain[0, ids.shape[1] :].tolist())
    return f"differs from token {moved} ({dtype} rounding)"


def report_prompt(run: PromptRun, ids, width: int, exact: bool, dtype: str) -> None:
    new = run.new_tokens
    say(f"    {'plain':{width}s}  {new / run.plain_s:6.1f} tok/s  ({new} tokens in {run.plain_s:.1f} s)")
    if not exact:
        moved = run.floor_moved
        say(
            f"    {'':{width}s}  plain as a row of a batch of 2: "
            + ("identical" if moved is None else f"differs from token {moved}")
        )
    for name, seconds in run.seconds.items():
        tau = new / run.forwards[name]
        share = "" if name == ENGINE_LABEL else f"speculation's share {speculation_share(run, name):.2f}x  "
        say(
            f"    {name:{width}s}  {new / seconds:6.1f} tok/s  tau {tau:.2f}  speedup {run.plain_s / seconds:.2f}x  {share}"
            f"{'lossless' if exact else 'identical'}: {identity_text(run, name, ids, exact, dtype)}"
        )


def find_disturbed(runs: list[PromptRun]) -> dict[str, dict[str, float]]:
    """``{method: {"prompt i": ratio}}``: runs whose time per token is far above the same method's other prompts'."""
    per_token = {"plain": {f"prompt {i + 1}": r.plain_s / r.new_tokens for i, r in enumerate(runs)}}
    for name in runs[0].seconds:
        per_token[name] = {f"prompt {i + 1}": r.seconds[name] / r.new_tokens for i, r in enumerate(runs)}
    found = {method: disturbed_runs(times) for method, times in per_token.items()}
    return {method: runs_ for method, runs_ in found.items() if runs_}


def remeasure(
    model, prompts, runs: list[PromptRun], disturbed: dict, drafters: dict, common: dict, exact: bool
) -> None:
    """Measure the disturbed prompts once more, alternating as before, and keep each method's faster time."""
    indices = sorted({int(label.split()[1]) - 1 for found in disturbed.values() for label in found})
    for i in indices:
        again = measure_prompt(model, prompts[i].input_ids, drafters, common, exact)
        runs[i].plain_s = min(runs[i].plain_s, again.plain_s)
        for name in runs[i].seconds:
            runs[i].seconds[name] = min(runs[i].seconds[name], again.seconds[name])


def lossless_text(runs: list[PromptRun], name: str, exact: bool, dtype: str) -> str:
    n = len(runs)
    same = sum(torch.equal(r.plain, r.outputs[name]) for r in runs)
    if same == n:
        return f"identical output on all {n} prompts"
    if exact:
        return f"BUT {n - same} of {n} outputs differ (a bug)"
    floor = sum(r.floor_moved is None for r in runs)  # bf16/fp16: read against plain decoding's own batch-shape noise
    return f"identical output on {same} of {n} prompts (plain decoding itself, as a row of a batch of 2: {floor} of {n}; {dtype} rounding)"


def report_verdicts(runs: list[PromptRun], exact: bool, dtype: str) -> None:
    """One verdict line per drafter, from the median of the per-prompt speedups (not total tokens over total time)."""
    tokens = sum(r.new_tokens for r in runs)
    say(f"plain: {tokens / sum(r.plain_s for r in runs):.1f} tok/s over all {len(runs)} prompts ({tokens} new tokens)")
    for name in runs[0].seconds:
        spread = SpeedupSpread.from_seconds([r.plain_s for r in runs], [r.seconds[name] for r in runs])
        tau = tokens / sum(r.forwards[name] for r in runs)
        share = (
            ""
            if name == ENGINE_LABEL
            else (
                f", speculation's own share {statistics.median(speculation_share(r, name) for r in runs):.2f}x over the engine"
            )
        )
        say(
            f"verdict: {name}: {spread.describe()} plain decoding, tau {tau:.2f} ({speedup_verdict(spread)} it){share}, "
            f"{lossless_text(runs, name, exact, dtype)}."
        )
        if spread.wide:
            say(
                f"         {name}: the per-prompt speedups spread widely; more prompts (--limit) make the median firmer"
            )


def run_demo(
    model, tokenizer, prompts, drafters: dict, max_new_tokens: int, dtype: str = "float32", show: int = 1
) -> list[PromptRun]:
    """Every prompt measured and printed as it comes (the engine with nothing drafted beside the drafters), disturbed
    prompts re-measured once, then the verdicts."""
    drafters = with_engine(drafters)
    exact = dtype == "float32"
    common = dict(max_new_tokens=max_new_tokens, do_sample=False)
    width = max(len(n) for n in drafters)
    runs = []
    for i, prompt in enumerate(prompts):
        say(f"[{i + 1}/{len(prompts)}] {prompt.category}: {prompt.record.prompt[:90]!r}")
        runs.append(measure_prompt(model, prompt.input_ids, drafters, common, exact))
        report_prompt(runs[-1], prompt.input_ids, width, exact, dtype)
        if i < show:
            answer = tokenizer.decode(runs[-1].plain[0, prompt.input_ids.shape[1] :], skip_special_tokens=True)
            say("    answer: " + answer.replace("\n", "\n            ")[:600])
    disturbed = find_disturbed(runs)
    if disturbed:
        remeasure(model, prompts, runs, disturbed, drafters, common, exact)
    say()
    line = disturbed_line(disturbed, remeasured=bool(disturbed))
    if line:
        say(line)
    report_verdicts(runs, exact, dtype)
    return runs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="mt_bench", help="built-in prompt set or prompt file (default: mt_bench)")
    parser.add_argument(
        "--limit", type=int, default=6, help="number of prompts, taken evenly across the set (default 6)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--drafter",
        default=DEFAULT_DRAFTER,
        help=f"prompt-lookup | token-recycling | hybrid | medusa | a drafter folder (default: {DEFAULT_DRAFTER})",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--show", type=int, default=1, help="print this many answers in full (default 1)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the target's dtype (default float32, where outputs are token-exact)",
    )
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()

    # a wrong prompt set or drafter folder fails here, before the model loads
    records = spread(load_prompts(args.prompts), args.limit)
    names = [n.strip() for n in args.drafter.split(",") if n.strip()]
    names = [
        n if n in ("prompt-lookup", "token-recycling", "hybrid", "medusa") else resolve_name_or_path(n, what="drafter")
        for n in names
    ]
    first = not (reference_cache_path() / "model.safetensors").is_file()
    say(
        "loading SmolLM2-135M-Instruct"
        + (" (first run: converting the GGUF file once, about a minute)" if first else "")
        + " ..."
    )
    model, tokenizer = load_reference_model(dtype=getattr(torch, args.dtype))
    hfs.enable(model)
    drafters = with_engine({name: load_drafter(name, model) for name in names})
    prompts = prepare_prompts(records, tokenizer)

    say(f"target:  SmolLM2-135M-Instruct, {args.dtype}, CPU, {torch.get_num_threads()} threads")
    for name, (_, what) in drafters.items():
        say(f"drafter: {name}: {what}")
    say(f"prompts: {len(prompts)} of {describe_prompts(args.prompts)}, {args.max_new_tokens} new tokens each, greedy")
    say("(wall-clock timings: other work on these cores changes them)\n")
    warm = prompts[0].input_ids
    plain_generate(model, warm, dict(max_new_tokens=8, do_sample=False))
    for drafter, _ in drafters.values():
        model.generate(warm, assistant_model=drafter, max_new_tokens=8, do_sample=False)
    run_demo(model, tokenizer, prompts, drafters, args.max_new_tokens, args.dtype, args.show)
    say(f"(the demo took {time.perf_counter() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
