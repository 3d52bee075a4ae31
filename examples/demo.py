"""Demo: SmolLM2-135M-Instruct answers chat prompts with and without tree speculative decoding.

    python examples/demo.py [--prompts mt_bench] [--limit 6] [--max-new-tokens 128] [--threads 2] [--drafter NAME|FOLDER,...]
                            [--dtype float32|bfloat16|float16]

For each prompt the demo runs plain greedy `generate()` and `generate(assistant_model=drafter)` for each drafter in this process
and prints each result as soon as it is measured: tokens/s of both, tau (tokens committed per target forward),
the speedup, and whether the two outputs are identical (in float32 they must be: greedy tree decoding is
lossless). It ends with one verdict line. Timings are wall-clock: run it on an otherwise idle machine.

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
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_speculative as hfs  # noqa: E402
from hf_speculative.bench import describe_prompts, load_prompts, load_reference_model, prepare_prompts  # noqa: E402
from hf_speculative.bench.numerics import first_divergence  # noqa: E402
from hf_speculative.bench.reference import reference_cache_path  # noqa: E402
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
        return hfs.PromptLookupDrafter(), ("n-gram tree drafter (prompt lookup: no draft model, 16-node budget; the fastest "
                                           "drafter measured on the held-out prompts, docs/results/2026-11-25-token-recycling.md)")
    if name == "token-recycling":
        return hfs.TokenRecyclingDrafter(), "Token Recycling (the target's verified top-k successors; no draft model, learns as it runs)"
    if name == "hybrid":
        parts = [hfs.PromptLookupDrafter(), hfs.TokenRecyclingDrafter()]
        return hfs.HybridDrafter(parts), "one tree merged from prompt lookup and Token Recycling (no draft model)"
    if name == "medusa":
        heads = hfs.MedusaHeadsModel.from_pretrained(HEADS, base_model=model)
        vocab = f", {heads.config.draft_vocab_size}-token draft vocabulary" if heads.config.draft_vocab_size else ""
        return heads, f"Medusa heads from {HEADS.relative_to(ROOT)} ({heads.config.num_heads} heads{vocab}, cost-aware tree)"
    from hf_speculative.bench.harness import load_drafter as load_drafter_folder

    drafter = load_drafter_folder(name, model)
    return drafter, f"{type(drafter).__name__} from {name}"


def spread(records, n: int):
    """``n`` records taken evenly across the set (one every len/n), so every category shows up."""
    step = max(1, len(records) // max(1, n))
    return records[::step][:n]


def say(text: str = "") -> None:
    print(text, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", default="mt_bench", help="built-in prompt set or prompt file (default: mt_bench)")
    parser.add_argument("--limit", type=int, default=6, help="number of prompts, taken evenly across the set (default 6)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafter", default=DEFAULT_DRAFTER, help=f"prompt-lookup | token-recycling | hybrid | medusa | a drafter folder (default: {DEFAULT_DRAFTER})")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--show", type=int, default=1, help="print this many answers in full (default 1)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the target's dtype (default float32, where outputs are token-exact)")
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()

    # a wrong prompt set or drafter folder fails here, before the model loads
    records = spread(load_prompts(args.prompts), args.limit)
    names = [n.strip() for n in args.drafter.split(",") if n.strip()]
    names = [n if n in ("prompt-lookup", "token-recycling", "hybrid", "medusa") else resolve_name_or_path(n, what="drafter") for n in names]
    first = not (reference_cache_path() / "model.safetensors").is_file()
    say("loading SmolLM2-135M-Instruct" + (" (first run: converting the GGUF file once, about a minute)" if first else "") + " ...")
    dtype = getattr(torch, args.dtype)
    exact = dtype == torch.float32
    model, tokenizer = load_reference_model(dtype=dtype)
    hfs.enable(model)
    drafters = {name: load_drafter(name, model) for name in names}
    prompts = prepare_prompts(records, tokenizer)

    say(f"target:  SmolLM2-135M-Instruct, {args.dtype}, CPU, {torch.get_num_threads()} threads")
    for name, (_, what) in drafters.items():
        say(f"drafter: {name}: {what}")
    say(f"prompts: {len(prompts)} of {describe_prompts(args.prompts)}, {args.max_new_tokens} new tokens each, greedy")
    say("(wall-clock timings: other work on these cores changes them)\n")
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    warm = prompts[0].input_ids
    transformers.GenerationMixin.generate(model, warm, max_new_tokens=8, do_sample=False)
    for drafter, _ in drafters.values():
        model.generate(warm, assistant_model=drafter, max_new_tokens=8, do_sample=False)

    tokens = 0
    t_plain_total = 0.0
    totals = {name: {"seconds": 0.0, "forwards": 0, "identical": 0} for name in drafters}
    floor_identical = 0
    width = max(len(n) for n in drafters)
    for i, prompt in enumerate(prompts):
        ids = prompt.input_ids
        say(f"[{i + 1}/{len(prompts)}] {prompt.category}: {prompt.record.prompt[:90]!r}")
        start = time.perf_counter()
        plain = transformers.GenerationMixin.generate(model, ids, **common)
        t_plain = time.perf_counter() - start
        new = plain.shape[1] - ids.shape[1]
        say(f"    {'plain':{width}s}  {new / t_plain:6.1f} tok/s  ({new} tokens in {t_plain:.1f} s)")
        if not exact:  # the numerics floor: plain decoding of the same prompt as one row of a batch of two
            two = transformers.GenerationMixin.generate(model, ids.expand(2, -1), **common)
            moved = first_divergence(two[0, ids.shape[1] : plain.shape[1]].tolist(), plain[0, ids.shape[1] :].tolist())
            floor_identical += moved is None
            say(f"    {'':{width}s}  plain as a row of a batch of 2: " + ("identical" if moved is None else f"differs from token {moved}"))
        for name, (drafter, _) in drafters.items():
            start = time.perf_counter()
            out = model.generate(ids, assistant_model=drafter, return_dict_in_generate=True, **common)
            t_spec = time.perf_counter() - start
            same = torch.equal(plain, out.sequences)
            stats = out.speculative_stats
            if same:
                verdict = "yes, identical output"
            elif exact:
                verdict = "NO, OUTPUT DIFFERS"
            else:
                moved = first_divergence(out.sequences[0, ids.shape[1] :].tolist(), plain[0, ids.shape[1] :].tolist())
                verdict = f"differs from token {moved} ({args.dtype} rounding)"
            say(f"    {name:{width}s}  {new / t_spec:6.1f} tok/s  tau {stats.mean_accepted_length:.2f}  speedup {t_plain / t_spec:.2f}x  "
                f"{'lossless' if exact else 'identical'}: {verdict}")  # fmt: skip
            totals[name]["seconds"] += t_spec
            totals[name]["forwards"] += len(stats.accepted_lengths)
            totals[name]["identical"] += same
        if i < args.show:
            answer = tokenizer.decode(plain[0, ids.shape[1]:], skip_special_tokens=True)
            say("    answer: " + answer.replace("\n", "\n            ")[:600])
        tokens += new
        t_plain_total += t_plain

    n = len(prompts)
    say(f"\nall {n} prompts, {tokens} new tokens (demo took {time.perf_counter() - t_start:.0f} s): plain {tokens / t_plain_total:.1f} tok/s")
    for name, t in totals.items():
        speedup = t_plain_total / t["seconds"]
        pace = "faster than" if speedup >= 1.02 else "slower than" if speedup <= 0.98 else "as fast as"
        if t["identical"] == n:
            lossless = f"identical output on all {n} prompts"
        elif exact:
            lossless = f"BUT {n - t['identical']} of {n} outputs differ (a bug)"
        else:  # bf16/fp16: read against plain decoding's own batch-shape noise
            lossless = (f"identical output on {t['identical']} of {n} prompts (plain decoding itself, as a row of a "
                        f"batch of 2: {floor_identical} of {n}; {args.dtype} rounding)")  # fmt: skip
        say(f"verdict: {name}: {tokens / t['seconds']:.1f} tok/s, tau {tokens / t['forwards']:.2f}, {speedup:.2f}x plain decoding "
            f"({pace} it), {lossless}.")  # fmt: skip


if __name__ == "__main__":
    main()
