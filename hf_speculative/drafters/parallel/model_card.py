"""The Hub model card of a ParallelDrafter folder, generated from a template and the drafter's config
(``training``, ``calibration`` and ``results`` entries written by the CLI and the benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

from ..card_text import curve_and_command_lines, drafter_location, usage_code

__all__ = ["MODEL_CARD_TEMPLATE", "render_model_card", "write_model_card", "usage_snippet"]

MODEL_CARD_TEMPLATE = """---
library_name: hf_speculative
pipeline_tag: text-generation
base_model: {base_model}
tags:
- speculative-decoding
- parallelspec
- hf_speculative
---

# ParallelSpec drafter for {base_model}

A parallel drafter (Xiao et al., 2024, "ParallelSpec", [arXiv:2410.05589](https://arxiv.org/abs/2410.05589)) for
`{base_model}`: {num_layers} decoder layer(s) of the target's architecture with its own final norm and
{k} learned [MASK] embeddings. ONE forward over the context and the {k} mask tokens drafts {k_plus_1} tokens,
which fill the draft tree; the target verifies the tree with `hf_speculative` behind
`model.generate(assistant_model=drafter)`. {conditioning} The target's embedding table and `lm_head` are
shared (frozen, not stored here). {params} parameters ({size}).

## Usage

{usage}

Greedy decoding gives exactly the target's tokens; sampling is exact (tree rejection sampling, ParallelSpec
Algorithm 1) unless the config's `acceptance` is `"typical"` (currently `{acceptance}`).

## Tree

{tree_text}

## Training

{training_text}

## Results

{results_text}

## Limitations

The drafter only drafts; every committed token is verified by the target. Its acceptance rate, and so the
speedup, depends on how close the text is to the training data (see Training).
"""


def _training_text(cfg) -> str:
    t = getattr(cfg, "training", None)
    if not t:
        return "Not recorded."
    lines = [
        f"- method: {t.get('method')}; loss `CE_0 + sum_j 0.8^j CE_j` (ParallelSpec eq. 3), distillation weight {t.get('distill_weight')}",
        f"- data: `{t.get('data')}` ({t.get('conversations')} conversations, {t.get('train_answer_tokens')} answer tokens; "
        f"{t.get('held_out_conversations')} held out for tree calibration)",
        f"- {t.get('steps')} steps of {t.get('batch_size')} sequences x {t.get('groups_per_sequence')} parallel groups "
        f"({t.get('train_groups_seen')} groups seen), learning rate {t.get('learning_rate')}, {t.get('train_seconds')} s on CPU, "
        f"last logged loss {t.get('last_logged_loss')}",
    ]
    lines += curve_and_command_lines(
        t, "held-out top-1 accuracy per depth, expected tau of the calibrated tree", "parallel groups seen | top-1 per depth (held out) | expected tau", "train_groups", "depth_top1"
    )
    return "\n".join(lines)


def _tree_text(cfg) -> str:
    from ...trees import TreeSpec

    tree = TreeSpec.from_choices(cfg.parallel_choices)
    text = f"{tree.num_nodes} nodes, depth {tree.depth} (`parallel_choices` in config.json)."
    cal = getattr(cfg, "calibration", None)
    if cal and "depth_top_i_accuracy" in cal:
        text += (
            "\nCalibrated (Medusa Sec. 2.3.3) from the held-out top-i accuracies of the k + 1 distributions, expected "
            f"acceptance length {cal.get('expected_acceptance_length', '?')}:\n\n"
            "| depth | top-1 | top-2 | top-3 | top-5 | top-10 (cumulative) |\n|---|---|---|---|---|---|\n"
        )
        for d, row in enumerate(cal["depth_top_i_accuracy"]):
            cum = [sum(row[: i + 1]) for i in range(len(row))]
            pick = [cum[i] if i < len(cum) else float("nan") for i in (0, 1, 2, 4, 9)]
            text += f"| {d + 1} | " + " | ".join(f"{v:.3f}" for v in pick) + " |\n"
    return text


def _results_text(cfg, results) -> str:
    results = results or getattr(cfg, "results", None)
    if not results:
        return "Not measured yet."
    if isinstance(results, str):
        return results
    return "```json\n" + json.dumps(results, indent=1) + "\n```"


def usage_snippet(base_model: str, location) -> str:
    loader = f'drafter = AutoModel.from_pretrained("{drafter_location(location)}")   # a ParallelDrafter: this folder, or its Hub repo id'
    return usage_code(base_model, [loader], imports=("from transformers import AutoModel",))


def render_model_card(drafter, results=None, location=None) -> str:
    """The card's markdown; ``location``: the folder or Hub id its Usage snippet loads the drafter from."""
    cfg = drafter.config
    params = sum(p.numel() for p in drafter.parameters())
    return MODEL_CARD_TEMPLATE.format(
        base_model=cfg.base_model_name_or_path or "<base model>",
        num_layers=cfg.num_layers,
        k=cfg.num_mask_tokens,
        k_plus_1=cfg.num_mask_tokens + 1,
        conditioning=(
            "Each context token is fused with the target's final hidden state at the previous position "
            "(`W [e(x_i); h_(i-1)]`, ParallelSpec Sec. 4.3)."
            if cfg.use_target_hidden_states
            else "It reads tokens only."
        ),
        params=f"{params:,}",
        size=f"{params * drafter.dtype.itemsize / 2**20:.1f} MiB in {str(drafter.dtype).replace('torch.', '')}",
        acceptance=cfg.acceptance,
        tree_text=_tree_text(cfg),
        training_text=_training_text(cfg),
        results_text=_results_text(cfg, results),
        usage=usage_snippet(cfg.base_model_name_or_path or "<base model>", location),
    )


def write_model_card(drafter, folder, results=None) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(render_model_card(drafter, results, location=folder), encoding="utf-8")
    return path
