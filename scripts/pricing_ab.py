"""Two step pricers in one process: every drafter under the pricer of an earlier revision and under the current one,
per prompt, the order of the two rotating; each arm keeps its own drafter objects, so each pricer carries its prices
across prompts as in use. Greedy outputs of the two arms are checked equal. Prints per drafter the median tokens/s
over prompts, tokens/s over all prompts, and tau.

    python scripts/pricing_ab.py --old-rev 979b996 --prompts heldout --per-category 3 \
        --methods suffix,eagle,hybrid:eagle+sx,medusa,tr --drafter eagle=outputs/train/chat-eagle3/drafter \
        --drafter medusa=model_cards/medusa-smollm2-135m-instruct \
        --drafter tr=model_cards/token-recycling-smollm2-135m-instruct --output outputs/pricing_ab.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import hf_speculative.engine.policy as policy_module
from hf_speculative.bench.harness import BenchOptions, build_methods, generate_kwargs
from hf_speculative.bench.prompts import first_per_category, load_prompts, prepare_prompts
from hf_speculative.bench.reference import resolve_model
from hf_speculative.engine.step_pricing import StepPricer
from hf_speculative.perf_model import machine_description


def old_pricer(rev: str):
    """``StepPricer`` as ``hf_speculative/engine/step_pricing.py`` was at git revision ``rev``."""
    source = subprocess.run(
        ["git", "show", f"{rev}:hf_speculative/engine/step_pricing.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_step_pricing.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_step_pricing", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up while it is built
    spec.loader.exec_module(module)
    return module.StepPricer


def arm_methods(pricer_class, names, model, tokenizer, options, warm_ids, common):
    """The methods of one arm, each drafter's pricer made (by a short warm-up call) from ``pricer_class``."""
    policy_module.StepPricer = pricer_class
    methods = build_methods(names, model, tokenizer, options)
    for method in methods:
        method.generate(warm_ids, torch.ones_like(warm_ids), **{**common, "max_new_tokens": 8})
    return methods


def one_call(method, prompt, common) -> tuple[dict, torch.Tensor]:
    start = time.perf_counter()
    out = method.generate(prompt, torch.ones_like(prompt), **common)
    seconds = time.perf_counter() - start
    new = out.sequences.shape[1] - prompt.shape[1]
    return {"s": seconds, "tokens": new, "forwards": len(out.speculative_stats.accepted_lengths)}, out.sequences


def summary(calls: list[dict]) -> str:
    median = statistics.median(c["tokens"] / c["s"] for c in calls)
    overall = sum(c["tokens"] for c in calls) / sum(c["s"] for c in calls)
    tau = sum(c["tokens"] for c in calls) / sum(c["forwards"] for c in calls)
    return f"{median:.1f} tok/s (median), {overall:.1f} overall, tau {tau:.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old-rev", required=True, help="the git revision whose step pricer is the old arm")
    p.add_argument("--prompts", default="heldout")
    p.add_argument("--per-category", type=int, default=3)
    p.add_argument("--methods", required=True, help="bench method names, comma-separated")
    p.add_argument("--drafter", action="append", default=[], help="NAME=PATH, as for hf-speculative bench")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    names = [n for n in args.methods.split(",") if n]
    options = BenchOptions(drafters=dict(d.split("=", 1) for d in args.drafter))
    model, tokenizer = resolve_model("reference", dtype=torch.float32)
    prompts = prepare_prompts(first_per_category(load_prompts(args.prompts), args.per_category), tokenizer)
    common = generate_kwargs(model, tokenizer, args.max_new_tokens, 0.0)
    warm = prompts[0].input_ids[:, :20]
    arms = {
        arm: arm_methods(cls, names, model, tokenizer, options, warm, common)
        for arm, cls in (("old", old_pricer(args.old_rev)), ("new", StepPricer))
    }
    results = {n: {"old": [], "new": []} for n in names}
    for i, prompt in enumerate(prompts):
        for j, name in enumerate(names):
            outputs = {}
            for arm in ("old", "new") if i % 2 == 0 else ("new", "old"):
                call, outputs[arm] = one_call(arms[arm][j], prompt.input_ids, common)
                results[name][arm].append(call)
            assert torch.equal(outputs["old"], outputs["new"]), f"prompt {i}, {name}: the two arms' outputs differ"
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)
    print(machine_description())
    for name in names:
        print(f"{name}: old {summary(results[name]['old'])} | new {summary(results[name]['new'])}")
    Path(args.output).write_text(json.dumps({"machine": machine_description(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
