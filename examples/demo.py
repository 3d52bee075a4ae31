"""Demo: SmolLM2-135M-Instruct answers chat prompts with and without tree speculative decoding.

    python examples/demo.py [--prompts mt_bench] [--limit 6] [--max-new-tokens 128] [--threads 2] [--drafter NAME|FOLDER]

For each prompt the demo runs plain greedy `generate()` and `generate(assistant_model=drafter)` in this process
and prints each result as soon as it is measured: tokens/s of both, tau (tokens committed per target forward),
the speedup, and whether the two outputs are identical (they must be: greedy tree decoding is lossless). It ends
with one verdict line. Timings are wall-clock: run it on an otherwise idle machine.

``--prompts``: a built-in prompt set (``mt_bench``, the default; ``heldout``, ``alpaca``, ... see
``hf_speculative/bench/data/README.md``) or a prompt file; ``--limit`` prompts are taken evenly across it.
``--drafter``: ``prompt-lookup`` (the model-free n-gram tree drafter), ``medusa`` (the trained reference Medusa
heads committed in `model_cards/`), or a drafter folder (any hf_speculative drafter or small causal LM).
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
from hf_speculative.bench.reference import reference_cache_path  # noqa: E402
from hf_speculative.hub import resolve_name_or_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEADS = ROOT / "model_cards" / "medusa-smollm2-135m-instruct"

#: The demo's drafter, when --drafter is not given. "prompt-lookup" | "medusa" | a drafter folder.
DEFAULT_DRAFTER = "prompt-lookup"


def load_drafter(name: str, model):
    """``(drafter, description)`` for ``--drafter``; a folder that does not exist raises (no silent fallback)."""
    if name == "prompt-lookup":
        return hfs.PromptLookupDrafter(), "n-gram tree drafter (prompt lookup: no draft model, 16-node budget)"
    if name == "medusa":
        heads = hfs.MedusaHeadsModel.from_pretrained(HEADS, base_model=model)
        return heads, f"Medusa heads from {HEADS.relative_to(ROOT)} ({heads.config.num_heads} heads, {heads.tree.num_nodes}-node tree)"
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
    parser.add_argument("--drafter", default=DEFAULT_DRAFTER, help=f"prompt-lookup | medusa | a drafter folder (default: {DEFAULT_DRAFTER})")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--show", type=int, default=1, help="print this many answers in full (default 1)")
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()

    # a wrong prompt set or drafter folder fails here, before the model loads
    records = spread(load_prompts(args.prompts), args.limit)
    if args.drafter not in ("prompt-lookup", "medusa"):
        args.drafter = resolve_name_or_path(args.drafter, what="drafter")
    first = not (reference_cache_path() / "model.safetensors").is_file()
    say("loading SmolLM2-135M-Instruct" + (" (first run: converting the GGUF file once, about a minute)" if first else "") + " ...")
    model, tokenizer = load_reference_model()
    hfs.enable(model)
    drafter, what = load_drafter(args.drafter, model)
    prompts = prepare_prompts(records, tokenizer)

    say(f"target:  SmolLM2-135M-Instruct, fp32, CPU, {torch.get_num_threads()} threads")
    say(f"drafter: {what}")
    say(f"prompts: {len(prompts)} of {describe_prompts(args.prompts)}, {args.max_new_tokens} new tokens each, greedy")
    say("(wall-clock timings: other work on these cores changes them)\n")
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    warm = prompts[0].input_ids
    transformers.GenerationMixin.generate(model, warm, max_new_tokens=8, do_sample=False)
    model.generate(warm, assistant_model=drafter, max_new_tokens=8, do_sample=False)

    tokens = forwards = 0
    t_plain_total = t_spec_total = 0.0
    identical = 0
    for i, prompt in enumerate(prompts):
        ids = prompt.input_ids
        say(f"[{i + 1}/{len(prompts)}] {prompt.category}: {prompt.record.prompt[:90]!r}")
        start = time.perf_counter()
        plain = transformers.GenerationMixin.generate(model, ids, **common)
        t_plain = time.perf_counter() - start
        new = plain.shape[1] - ids.shape[1]
        say(f"    plain        {new / t_plain:6.1f} tok/s  ({new} tokens in {t_plain:.1f} s)")
        start = time.perf_counter()
        out = model.generate(ids, assistant_model=drafter, return_dict_in_generate=True, **common)
        t_spec = time.perf_counter() - start
        same = torch.equal(plain, out.sequences)
        stats = out.speculative_stats
        say(f"    speculative  {new / t_spec:6.1f} tok/s  tau {stats.mean_accepted_length:.2f}  speedup {t_plain / t_spec:.2f}x  "
            f"lossless: {'yes, identical output' if same else 'NO, OUTPUT DIFFERS'}")  # fmt: skip
        if i < args.show:
            answer = tokenizer.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True)
            say("    answer: " + answer.replace("\n", "\n            ")[:600])
        tokens += new
        forwards += len(stats.accepted_lengths)
        t_plain_total += t_plain
        t_spec_total += t_spec
        identical += same

    n = len(prompts)
    speedup = t_plain_total / t_spec_total
    say(f"\nall {n} prompts: plain {tokens / t_plain_total:.1f} tok/s, speculative {tokens / t_spec_total:.1f} tok/s, "
        f"tau {tokens / forwards:.2f}, speedup {speedup:.2f}x, identical outputs {identical}/{n} "
        f"(demo took {time.perf_counter() - t_start:.0f} s)")  # fmt: skip
    pace = "faster than" if speedup >= 1.02 else "slower than" if speedup <= 0.98 else "as fast as"
    lossless = f"with identical output on all {n} prompts" if identical == n else f"BUT {n - identical} of {n} outputs differ (a bug)"
    say(f"verdict: tree speculative decoding ({args.drafter}) was {speedup:.2f}x plain decoding ({pace} it), {lossless}.")


if __name__ == "__main__":
    main()
