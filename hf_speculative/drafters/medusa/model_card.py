"""The Hub model card of a Medusa heads folder, generated from a template and the heads' config
(``training``, ``calibration`` and ``results`` entries written by the CLI and the benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

from ..card_text import curve_and_command_lines, drafter_location, usage_code

__all__ = [
    "MODEL_CARD_TEMPLATE",
    "MEDUSA2_MODEL_CARD_TEMPLATE",
    "render_model_card",
    "write_model_card",
    "render_medusa2_model_card",
    "write_medusa2_model_card",
    "usage_snippet",
    "medusa2_usage_snippet",
]

MODEL_CARD_TEMPLATE = """---
library_name: hf_speculative
pipeline_tag: text-generation
base_model: {base_model}
tags:
- speculative-decoding
- medusa
- hf_speculative
---

# Medusa heads for {base_model}

{num_heads} Medusa heads (Cai et al., 2024, [arXiv:2401.10774](https://arxiv.org/abs/2401.10774)) for
`{base_model}`, for tree speculative decoding with `hf_speculative` behind
`model.generate(assistant_model=heads)`. Each head is {num_layers} residual block(s) `h + SiLU(W1 h + b1)`
on the base model's final hidden state, then {projection}. {params} parameters ({size}).

## Usage

{usage}

Greedy decoding gives exactly the base model's tokens; sampling is exact (tree rejection sampling) unless
the config's `acceptance` is `"typical"` (currently `{acceptance}`).

## Tree

{tree_text}

## Training

{training_text}

## Results

{results_text}

## Limitations

The heads only draft; every committed token is verified by the base model. Their acceptance rate, and so the
speedup, depends on how close the text is to the training data (self-distilled chat answers).
"""


def _training_text(cfg) -> str:
    t = getattr(cfg, "training", None)
    if not t:
        return "Not recorded."
    lines = [
        f"- method: {t.get('method')}, loss "
        + ("`sum_k 0.8^k KL(p_target(. | x_<=t+k+1) || head_k(h_t))` (the target's stored top-k)" if "KD" in str(t.get("method")) else "`sum_k 0.8^k CE(head_k(h_t), x_(t+k+2))`"),
        f"- data: `{t.get('data')}` ({t.get('conversations')} conversations, {t.get('train_answer_tokens')} answer tokens; "
        f"{t.get('held_out_conversations')} held out for tree calibration)",
        f"- {t.get('epochs')} epochs, learning rate {t.get('learning_rate')}, batch {t.get('batch_size')} positions, "
        f"{t.get('train_seconds')} s on CPU, mean training loss {t.get('final_loss')} (`sum_k 0.8^k CE_k`)",
    ]
    lines += curve_and_command_lines(
        t, "held-out head top-1 accuracy, expected tau of the calibrated tree", "training positions seen (the data repeat after one epoch) | head top-1 (held out) | expected tau", "train_positions", "head_top1"
    )
    return "\n".join(lines)


def _tree_text(cfg) -> str:
    from ...trees import TreeSpec

    tree = TreeSpec.from_choices(cfg.medusa_choices)
    text = f"{tree.num_nodes} nodes, depth {tree.depth} (`medusa_choices` in config.json)."
    cal = getattr(cfg, "calibration", None)
    if cal and "head_top_i_accuracy" in cal:
        text += (
            "\nCalibrated (Medusa Sec. 2.3.3) from the heads' held-out top-i accuracies"
            f" ({cal.get('num_positions', '?')} positions), expected acceptance length "
            f"{cal.get('expected_acceptance_length', '?')}:\n\n| head | top-1 | top-2 | top-3 | top-5 | top-10 (cumulative) |\n|---|---|---|---|---|---|\n"
        )
        for k, row in enumerate(cal["head_top_i_accuracy"]):
            cum = [sum(row[: i + 1]) for i in range(len(row))]
            pick = [cum[i] if i < len(cum) else float("nan") for i in (0, 1, 2, 4, 9)]
            text += f"| {k} | " + " | ".join(f"{v:.3f}" for v in pick) + " |\n"
    return text


def _results_text(cfg, results) -> str:
    results = results or getattr(cfg, "results", None)
    if not results:
        return "Not measured yet."
    if isinstance(results, str):
        return results
    return "```json\n" + json.dumps(results, indent=1) + "\n```"


_GENERATE_WITH_HEADS = "model.generate(**enc, assistant_model=heads, max_new_tokens=128, do_sample=False)"


def usage_snippet(base_model: str, location) -> str:
    loader = f'heads = AutoModel.from_pretrained("{drafter_location(location)}")   # a MedusaHeadsModel: this folder, or its Hub repo id'
    return usage_code(base_model, [loader], generate_call=_GENERATE_WITH_HEADS, imports=("from transformers import AutoModel",))


def medusa2_usage_snippet(base_model: str, location) -> str:
    loader = f'model, heads = load_medusa2("{drafter_location(location)}", base, merge=True)   # this folder; base + adapter/, merged'
    imports = ("from hf_speculative.drafters.medusa.training_medusa2 import load_medusa2",)
    return usage_code(base_model, [loader, "hfs.enable(model)"], _GENERATE_WITH_HEADS, imports, base_name="base", enable=False)


def render_model_card(heads, results=None, location=None) -> str:
    """The card's markdown; ``location``: the folder or Hub id its Usage snippet loads the drafter from."""
    cfg = heads.config
    params = sum(p.numel() for p in heads.parameters())
    return MODEL_CARD_TEMPLATE.format(
        base_model=cfg.base_model_name_or_path or "<base model>",
        num_heads=cfg.num_heads,
        num_layers=cfg.num_layers,
        projection="the base model's own frozen `lm_head` (shared, not stored here)" if cfg.share_lm_head else "its own vocabulary projection W2",
        params=f"{params:,}",
        size=f"{params * heads.dtype.itemsize / 2**20:.1f} MiB in {str(heads.dtype).replace('torch.', '')}",
        acceptance=cfg.acceptance,
        tree_text=_tree_text(cfg),
        training_text=_training_text(cfg),
        results_text=_results_text(cfg, results),
        usage=usage_snippet(cfg.base_model_name_or_path or "<base model>", location),
    )


def write_model_card(heads, folder, results=None) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(render_model_card(heads, results, location=folder), encoding="utf-8")
    return path


MEDUSA2_MODEL_CARD_TEMPLATE = """---
library_name: hf_speculative
pipeline_tag: text-generation
base_model: {base_model}
tags:
- speculative-decoding
- medusa
- medusa-2
- lora
- peft
- hf_speculative
---

# Medusa-2 for {base_model}: LoRA adapter + {num_heads} Medusa heads

Medusa-2 (Cai et al., 2024, [arXiv:2401.10774](https://arxiv.org/abs/2401.10774), Sec. 2.2.2): the backbone
`{base_model}` got a LoRA adapter (`adapter/`, PEFT format) trained **jointly** with {num_heads} Medusa heads
(`config.json` + `model.safetensors` here; each head {num_layers} residual block(s) `h + SiLU(W1 h + b1)`, then
{projection}; {params} head parameters, {size}).

**This is a CHANGED model.** The heads draft for base + adapter, not for the base model. Greedy decoding with the
heads gives exactly the tokens of base + adapter's own greedy decoding, which differ from the base model's
(see the quality numbers below).

## Usage

{usage}

## Tree

{tree_text}

## Training

{training_text}

## Results

{results_text}

## Limitations

Every committed token is verified by base + adapter, so decoding with the heads is lossless with respect to
*that* model; the adapter itself changes the base model's outputs. Acceptance depends on how close the text is
to the training data (self-distilled chat answers).
"""


def _medusa2_training_text(cfg) -> str:
    t = getattr(cfg, "training", None)
    if not t:
        return "Not recorded."
    lora = t.get("lora") or {}
    sched = t.get("lambda0_schedule") or {}
    lm = {"kl": "`KL(p_original || p)` (self-distillation against the adapter-disabled model, Medusa 2.3.2)",
          "ce": "next-token cross entropy", "ce+kl": "cross entropy + `KL(p_original || p)`"}.get(t.get("lm_loss"), t.get("lm_loss"))
    lines = [
        f"- method: {t.get('method')}; loss `L_LM + lambda_0 * sum_k 0.8^k CE(head_k(h_t), x_(t+k+2))`, L_LM = {lm}",
        f"- base: {t.get('base')}",
        f"- LoRA: r={lora.get('r')}, alpha={lora.get('alpha')}, dropout={lora.get('dropout')}, on {lora.get('target_modules')}",
        f"- learning rates: LoRA {t.get('learning_rate_lora')}, heads {t.get('learning_rate_heads')} (separate optimizer parameter groups)",
        f"- lambda_0 = {t.get('lambda0')}, schedule `{sched.get('kind')}` rising over warm-up {sched.get('warmup')} (share of steps if < 1); "
        f"heads initialised from {('`' + t['init_heads'] + '` (Medusa-1 stage)') if t.get('init_heads') else 'zero-init W1 (no Medusa-1 stage)'}",
        f"- data: `{t.get('data')}` ({t.get('conversations')} training conversations"
        + (f", {t['train_conversations_used']} with answer tokens within {t.get('max_length')} tokens" if t.get("train_conversations_used") else "")
        + f", {t.get('train_answer_tokens')} answer tokens, "
        f"{t.get('held_out_conversations')} held out); {t.get('optimizer_steps')} optimizer steps x {t.get('batch_size')} x "
        f"{t.get('gradient_accumulation_steps')} conversations (max {t.get('max_length')} tokens each) = {t.get('conversations_seen')} "
        f"conversations seen, {t.get('train_seconds')} s on CPU"
        + (f" (time budget {t['time_budget_s']} s)" if t.get("time_budget_s") else "")
        + (f"; L_Medusa on at most {t['max_head_positions']} random positions per step" if t.get("max_head_positions") else ""),
    ]
    if "held_out_lm_loss_base" in t:
        lines.append(f"- held-out answer LM loss (CE per token): base {t['held_out_lm_loss_base']}, base + adapter {t['held_out_lm_loss_adapted']}")
    if t.get("command"):
        lines.append(f"- command:\n\n```bash\n{t['command']}\n```")
    return "\n".join(lines)


def render_medusa2_model_card(heads, results=None, location=None) -> str:
    """The card's markdown; ``location``: the folder or Hub id its Usage snippet loads the drafter from."""
    cfg = heads.config
    params = sum(p.numel() for p in heads.parameters())
    return MEDUSA2_MODEL_CARD_TEMPLATE.format(
        base_model=cfg.base_model_name_or_path or "<base model>",
        num_heads=cfg.num_heads,
        num_layers=cfg.num_layers,
        projection="the backbone's own frozen `lm_head` (shared, not stored)" if cfg.share_lm_head else "its own vocabulary projection W2",
        params=f"{params:,}",
        size=f"{params * heads.dtype.itemsize / 2**20:.1f} MiB in {str(heads.dtype).replace('torch.', '')}",
        tree_text=_tree_text(cfg),
        training_text=_medusa2_training_text(cfg),
        results_text=_results_text(cfg, results),
        usage=medusa2_usage_snippet(cfg.base_model_name_or_path or "<base model>", location),
    )


def write_medusa2_model_card(heads, folder, results=None) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(render_medusa2_model_card(heads, results, location=folder), encoding="utf-8")
    return path
