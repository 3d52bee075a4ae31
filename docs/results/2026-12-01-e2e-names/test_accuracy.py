"""An EAGLE-3 folder's accuracy per drafting step on a task's test prompts, beside its calibration's.

    python docs/results/2026-12-01-e2e-names/test_accuracy.py model_cards/eagle3-smollm2-135m-e2e-nlg \
        --task e2e_nlg --data ../shared/data/e2e_nlg --limit 48

The training-time test (`eagle_step_accuracies`, EAGLE-3 Sec. 3.2) on the first ``--limit`` test prompts, answered by
the folder's own fine-tuned model (greedy, float32) and labelled by it: per unrolled step, how often the drafter's
top-1 is the model's token, the true tokens fed before it. The folder's calibration measured the same on its held-out
training prompts. Step 1 is then split by the model's token: inside the drafter's draft vocabulary, or a token of the
prompt outside it (a "context token", scored with the target's ``lm_head`` row), with the rank the drafter gave the
context tokens and the mean logits of both kinds. A measurement only: nothing is trained or tuned on these prompts.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from downstream.evaluation import load_downstream  # noqa: E402
from downstream.tasks import get_task  # noqa: E402
from downstream.training import DownstreamTrainingConfig, _calibration_states  # noqa: E402

from hf_speculative.drafters.eagle.modeling_eagle import EagleDrafter  # noqa: E402
from hf_speculative.drafters.eagle.training_eagle import (  # noqa: E402
    EagleCollator,
    EagleDataset,
    _unrolled_steps,
    eagle_step_accuracies,
)


def first_step_split(drafter: EagleDrafter, dataset: EagleDataset, batch_size: int = 8) -> dict:
    """Step 1's hits by kind of token (``vocab`` / ``context``), the context tokens' ranks among all columns, and the
    mean top logit of the draft vocabulary against the mean logit of the right context token."""
    vocab = set(drafter.draft_target_ids.tolist())
    hits, ranks, top_vocab, right_context = collections.Counter(), [], [], []
    V = drafter.lm_head.out_features
    for b in range(0, len(dataset), batch_size):
        batch = EagleCollator()([dataset[i] for i in range(b, min(b + batch_size, len(dataset)))])
        for _s, _rows, logits, tid, _tlp, _index, columns in _unrolled_steps(drafter, batch, 1):
            logits = logits.float()
            ids = columns.target_ids(torch.arange(logits.shape[1])[None].expand(logits.shape[0], -1))
            pred = ids.gather(1, logits.argmax(-1, keepdim=True))[:, 0]
            for row, (p, t) in enumerate(zip(pred.tolist(), tid[:, 0].tolist())):
                kind = "vocab" if t in vocab else "context"
                hits[kind, p == t] += 1
                where = (ids[row] == t).nonzero()
                if kind == "context" and len(where):
                    right = logits[row, where[0, 0]]
                    ranks.append(int((logits[row] > right).sum()))
                    top_vocab.append(float(logits[row, :V].max()))
                    right_context.append(float(right))
    return {
        "hits": {f"{k} {'right' if ok else 'wrong'}": n for (k, ok), n in sorted(hits.items())},
        "context_rank_median": statistics.median(ranks) if ranks else None,
        "top_vocab_logit_mean": statistics.mean(top_vocab) if top_vocab else None,
        "right_context_logit_mean": statistics.mean(right_context) if right_context else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--task", default="e2e_nlg")
    p.add_argument("--data", required=True)
    p.add_argument("--limit", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    arm = load_downstream(args.folder)
    drafter = EagleDrafter.from_pretrained(args.folder, base_model=arm.model).float().eval()
    records = get_task(args.task).load(args.data, "test")[: args.limit]
    L = arm.model.config.num_hidden_layers
    layers = [i for i in drafter.config.feature_layers(L) if i != L]  # the final state is labelled anyway
    cfg = DownstreamTrainingConfig(answers="self", progress=False)
    with tempfile.TemporaryDirectory() as out, torch.no_grad():
        name = f"test-{args.limit}"
        states, n = _calibration_states(arm.model, arm.tokenizer, records, Path(out), cfg, args.task, name, layers)
        steps = eagle_step_accuracies(drafter, states, steps=6, top=1)
        split = first_step_split(drafter, EagleDataset(states, drafter.config.feature_layers(L), L, 512))
    calibration = (drafter.config.calibration or {}).get("step_top_i_accuracy") or []
    print(f"{args.folder}: {n} test prompts")
    print("test top-1 per step:       ", " / ".join(f"{a[0]:.2f}" for a in steps))
    print("calibration top-1 per step:", " / ".join(f"{a[0]:.2f}" for a in calibration))
    print("step 1 by kind of token:", split)


if __name__ == "__main__":
    main()
