"""The Hub model card of an EagleDrafter folder, generated from the drafter's config (the ``training`` and
``results`` entries written by ``hf-speculative train eagle`` and the benchmark)."""

from __future__ import annotations

from pathlib import Path

from ..card_text import drafter_location, usage_code

__all__ = ["render_model_card", "write_model_card", "usage_snippet"]

_TEMPLATE = """---
library_name: hf_speculative
pipeline_tag: text-generation
base_model: {base_model}
tags:
- speculative-decoding
- eagle
- {variant}
- hf_speculative
---

# {title} drafter for {base_model}

An {title} drafter ({paper}) for `{base_model}`, run by `hf_speculative` behind
`model.generate(assistant_model=drafter)` with exact tree verification. {arch} The target's embedding table
is shared (not stored here). {params} parameters ({size}).

## Usage

{usage}

`AutoModel.from_pretrained(folder)` also loads it after `import hf_speculative`. Greedy decoding gives
exactly the target's tokens; sampling is exact (tree rejection sampling). The default tree is EAGLE-2's dynamic
tree ({tree}); pass `speculative_tree=hfs.TreeSpec...` for a static one.

## Training

{training}

## Results

{results}

## Limitations

A small drafter trained for minutes on a CPU: its acceptance, and so the speedup, is far below what EAGLE
reaches with hours of GPU training; every committed token is verified by the target.
"""


def usage_snippet(base_model: str, location) -> str:
    loader = f'drafter = hfs.EagleDrafter.from_pretrained("{drafter_location(location)}", base_model=model, dtype="float32")'
    return usage_code(base_model, [loader + "   # this folder, or its Hub repo id"])


def render_model_card(drafter, location=None) -> str:
    """The card's markdown; ``location``: the folder or Hub id its Usage snippet loads the drafter from."""
    cfg = drafter.config
    eagle3 = cfg.is_eagle3
    params = sum(p.numel() for p in drafter.parameters())
    size = sum(p.numel() * p.element_size() for p in drafter.parameters()) + sum(b.numel() * b.element_size() for b in drafter.buffers())
    arch = (
        f"`fc` fuses three target layers {cfg.feature_layers()} (3H -> H); one decoder layer attends over [normed embedding ; "
        f"normed feature] (2H); its own `lm_head` over a {cfg.draft_vocab_size or cfg.vocab_size}-token draft vocabulary "
        "(`d2t`: target id = draft id + d2t[draft id])."
        if eagle3
        else "`fc` over [token embedding ; the target's final feature] (2H -> H), one decoder layer, the target's `lm_head`."
    )
    t = getattr(cfg, "training", None) or {}
    training = "\n".join(f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in t.items()) or "Not recorded."
    r = getattr(cfg, "results", None)
    results = "\n".join(f"- {k}: {v}" for k, v in r.items()) if isinstance(r, dict) else (r or "See the repository's docs/eagle.md.")
    return _TEMPLATE.format(
        base_model=cfg.base_model_name_or_path or "the target", variant=cfg.variant, title="EAGLE-3" if eagle3 else "EAGLE",
        paper="Li et al. 2025, EAGLE-3, arXiv:2503.01840" if eagle3 else "Li et al. 2024, EAGLE, arXiv:2401.15077",
        arch=arch, params=f"{params / 1e6:.1f}M", size=f"{size / 2**20:.1f} MiB", tree=repr(cfg.tree),
        training=training, results=results, usage=usage_snippet(cfg.base_model_name_or_path or "the target", location),
    )  # fmt: skip


def write_model_card(drafter, folder) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(render_model_card(drafter, location=folder), encoding="utf-8")
    return path
