"""Batched answering of a downstream task's training prompts by its LoRA model: aggregate new tokens/s of plain
batched ``generate()`` against the engine with SuffixDecoding (warmed with the training references), per batch size.

    python scripts/self_distill_speed.py --task wikisql --data ../shared/data/wikisql \
        --adapter model_cards/lora-smollm2-135m-wikisql --threads 2

The prompts are training prompts 3000-3063 (never a test prompt); one warm-up batch first. Each speculative run
starts from a fresh SuffixDrafter warmed with the references only (a drafter that had seen these prompts' answers in an
earlier run would draft them from memory). Plain and speculative answers are compared (greedy: they must be equal).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="wikisql")
    p.add_argument("--data", required=True)
    p.add_argument("--adapter", required=True, help="a 'downstream train --method lora' folder")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", default="plain:32,suffix:1,suffix:8,plain:8,suffix:32", help="KIND:BATCH,...")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from downstream.evaluation import _merged, _suffix_drafter, training_targets
    from downstream.self_distilled import unique_prompts
    from downstream.tasks import calibration_split, get_task

    import hf_speculative as hfs
    from hf_speculative.bench.harness import machine_info
    from hf_speculative.bench.reference import resolve_model
    from hf_speculative.training.distill import _generate_batch, _generation_kwargs

    spec = get_task(args.task)
    train, _ = calibration_split(spec.load(args.data, "train"), 48, seed=0)
    prompts = [r.conversation(1, []) for r in unique_prompts(train)[3000:3064]]
    base, tok = resolve_model("reference")
    model = hfs.enable(_merged(base, Path(args.adapter)))
    references = training_targets(args.task, args.data)[:3000]
    plain_kwargs = _generation_kwargs(model, tok, spec.max_new_tokens, 0.0, None)
    warm_up = _generation_kwargs(model, tok, spec.max_new_tokens, 0.0, None, _suffix_drafter(references, tok))
    _generate_batch(model, tok, [unique_prompts(train)[2990].conversation(1, [])], warm_up)  # not a timed prompt
    answers = {}
    print(machine_info(model.device))
    for run in args.runs.split(","):
        kind, batch = run.split(":")
        batch, n = int(batch), 16 if int(batch) == 1 else 32
        kwargs = plain_kwargs
        if kind == "suffix":  # a fresh drafter: it has seen none of these answers
            kwargs = _generation_kwargs(model, tok, spec.max_new_tokens, 0.0, None, _suffix_drafter(references, tok))
        t0, tokens, texts = time.perf_counter(), 0, []
        for b in range(0, n, batch):
            for text, new, _ in _generate_batch(model, tok, prompts[b : b + batch], kwargs):
                tokens, texts = tokens + new, [*texts, text]
        seconds = time.perf_counter() - t0
        same = all(answers.get(i, t) == t for i, t in enumerate(texts))
        answers.update(enumerate(texts))
        print(f"{kind:7s} batch {batch:3d}: {tokens / seconds:6.1f} new tok/s over {n} prompts  same answers: {same}")


if __name__ == "__main__":
    main()
