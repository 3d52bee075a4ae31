"""The Hub model card of a Speculative Streaming folder, generated from a template and the config
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
- speculative-streaming
- hf_speculative
---

# Speculative Streaming streams for {base_model}

Speculative Streaming (Bhendawade et al., 2024, [arXiv:2402.11131](https://arxiv.org/abs/2402.11131)) for
`{base_model}`, in **{mode}** mode: the base model's top {num_msa_layers} layers run as multi-stream attention
layers with {num_streams} speculative streams, so the model drafts for itself inside `generate()` with no
draft model. This folder holds only what the method adds: the stream identifier embeddings and low-rank
(rank {adapter_rank}) stream-row adapters on the MSA layers' projections, {params} parameters ({share} of the
base model's {base_params}); the base weights are not included and are loaded from `base_model`.

## Usage

{usage}

In lossless mode the main stream is the base model's own forward: greedy decoding gives exactly the base
model's tokens and sampling is exact (tree rejection sampling with the stream distributions as proposals).

## Tree

{tree_text}
{pruning_text}
## Training

{training_text}

## Results

{results_text}

## Limitations

Trained briefly on CPU (see Training); acceptance (and so the speedup) depends on how close the text is to
that data. Shared mode, parallel tree pruning and the value-rotation design are not used.
"""


def _training_text(cfg) -> str:
    t = getattr(cfg, "training", None)
    if not t:
        return "Not recorded."
    lines = [
        f"- method: {t.get('method')}; loss `sum_j CE(stream_j(t), y_(t+1+j))`, j = 1..{cfg.num_streams}",
        f"- data: `{t.get('data')}` ({t.get('conversations')} conversations, {t.get('train_answer_tokens')} answer tokens; "
        f"{t.get('held_out_conversations')} held out for tree calibration)",
        f"- epochs {t.get('epochs')} (max steps {t.get('max_steps')}), learning rate {t.get('learning_rate')}, "
        f"batch {t.get('batch_size')} segments of {t.get('segment_length')} tokens, {t.get('train_seconds')} s on CPU, "
        f"mean training loss {t.get('final_loss')}",
    ]
    lines += curve_and_command_lines(
        t, "held-out stream top-1 accuracy, expected tau of the calibrated tree", "segment positions seen (prompt + answer) | stream top-1 (held out) | expected tau", "train_tokens", "stream_top1"
    )
    return "\n".join(lines)


def _tree_text(cfg) -> str:
    from ...trees import TreeSpec

    tree = TreeSpec.from_choices(cfg.stream_tree)
    text = f"{tree.num_nodes} nodes, depth {tree.depth} (`stream_tree` in config.json)."
    cal = getattr(cfg, "calibration", None)
    if cal and "stream_top_i_accuracy" in cal:
        text += (
            f"\nCalibrated from the streams' held-out top-i accuracies (Medusa Sec. 2.3.3 greedy build), expected "
            f"acceptance length {cal.get('expected_acceptance_length', '?')}:\n\n"
            "| stream | top-1 | top-2 | top-3 | top-5 | top-10 (cumulative) |\n|---|---|---|---|---|---|\n"
        )
        for j, row in enumerate(cal["stream_top_i_accuracy"]):
            cum = [sum(row[: i + 1]) for i in range(len(row))]
            pick = [cum[i] if i < len(cum) else float("nan") for i in (0, 1, 2, 4, 9)]
            text += f"| {j + 1} | " + " | ".join(f"{v:.3f}" for v in pick) + " |\n"
    return text


def _pruning_text(cfg) -> str:
    """The parallel tree pruning section (Sec. 3.1.3), when the folder has a pruning head."""
    if getattr(cfg, "pruning_layer", None) is None:
        return ""
    p = getattr(cfg, "pruning", None) or {}
    lines = [
        "\n## Parallel tree pruning\n",
        f"An early exit after layer {cfg.pruning_layer} (the base's norm and `lm_head` plus a rank-{cfg.pruning_rank} adapter) "
        f"estimates each tree node's transition probability from its parent inside the verification forward; nodes below "
        f"{cfg.pruning_threshold} are dropped with their subtrees before the upper layers (greedy drafts only; output unchanged).",
    ]
    if p:
        lines.append(
            f"\nTrained with next-token CE on `{p.get('data')}` ({p.get('train_answer_tokens')} answer tokens, {p.get('steps_done')} steps, "
            f"{p.get('train_seconds')} s on CPU): held-out top-1 of the early exit {p.get('held_out_top1_before')} before, "
            f"{p.get('held_out_top1_after')} after."
        )
        if p.get("command"):
            lines.append(f"\n```bash\n{p['command']}\n```")
    return "\n".join(lines) + "\n"


def _results_text(cfg, results) -> str:
    results = results or getattr(cfg, "results", None)
    if not results:
        return "Not measured yet."
    if isinstance(results, str):
        return results
    return "```json\n" + json.dumps(results, indent=1) + "\n```"


def usage_snippet(base_model: str, location) -> str:
    loader = f'ss = hfs.LlamaForSpeculativeStreaming.from_pretrained("{drafter_location(location)}", base_model=base)   # this folder, or its Hub repo id'
    call = "ss.generate(**enc, max_new_tokens=128, do_sample=False)   # drafts for itself"
    return usage_code(base_model, [loader], generate_call=call, base_name="base", enable=False)


def render_model_card(ss, results=None, location=None) -> str:
    """The card's markdown; ``location``: the folder or Hub id its Usage snippet loads the drafter from."""
    cfg = ss.config
    params = ss.num_stream_parameters()
    base_params = (cfg.training or {}).get("base_parameters") or (sum(p.numel() for p in ss.base.parameters()) if ss.base is not None else None)
    return MODEL_CARD_TEMPLATE.format(
        base_model=cfg.base_model_name_or_path or "<base model>",
        mode=cfg.mode,
        num_msa_layers=cfg.num_msa_layers,
        num_streams=cfg.num_streams,
        adapter_rank=cfg.adapter_rank,
        params=f"{params:,}",
        share=f"{100 * params / base_params:.3f}%" if base_params else "?",
        base_params=f"{base_params:,}" if base_params else "?",
        tree_text=_tree_text(cfg),
        pruning_text=_pruning_text(cfg),
        training_text=_training_text(cfg),
        results_text=_results_text(cfg, results),
        usage=usage_snippet(cfg.base_model_name_or_path or "<base model>", location),
    )


def write_model_card(ss, folder, results=None) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(render_model_card(ss, results, location=folder), encoding="utf-8")
    return path
