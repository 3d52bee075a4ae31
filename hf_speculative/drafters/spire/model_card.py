"""The Hub model card of a SpireDrafter folder, generated from the drafter's config (the ``training`` and
``results`` entries written by ``hf-speculative train spire`` and the benchmark)."""

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
- spire
- hf_speculative
---

# SPIRe drafter for {base_model}

A SPIRe drafter (Neelam et al. 2025, "SPIRe: Boosting LLM Inference Throughput with Speculative Decoding",
arXiv:2504.06419) for `{base_model}`, run by `hf_speculative` behind `model.generate(assistant_model=drafter)` with
exact tree verification. {num_layers} decoder layers pruned from the target's layers {layers} (Sec. 3.2), a
StreamingLLM sparse KV cache of {window} positions plus {sinks} sink token(s) (Sec. 3.1), and feedback memory over
the drafter's activations, with the target's own activations as memory at verified positions (Sec. 3.3). The
target's embeddings and `lm_head` are shared (not stored here){vocab}. {params} parameters ({size}).

## Usage

{usage}

`AutoModel.from_pretrained(folder)` also loads it after `import hf_speculative`. Greedy decoding gives
exactly the target's tokens; sampling is exact (tree rejection sampling). Each step drafts a chain of
{k} tokens with {top_i} candidate(s) per depth ({nodes} tree nodes).

## Training

{training}

## Results

{results}

## Limitations

Trained for minutes on a CPU: acceptance, and so the speedup, are far below what the paper reaches with long GPU
training. SPIRe is built for throughput at large batch and long context on accelerators, where the target's KV
cache dominates a step; on a CPU at batch 1 a step's cost is the weights, so its sparse cache buys little here.
"""


def usage_snippet(base_model: str, location) -> str:
    loader = f'drafter = hfs.SpireDrafter.from_pretrained("{drafter_location(location)}", base_model=model, dtype="float32")'
    return usage_code(base_model, [loader + "   # this folder, or its Hub repo id"])


def render_model_card(drafter, location=None) -> str:
    """The card's markdown; ``location``: the folder or Hub id its Usage snippet loads the drafter from."""
    cfg = drafter.config
    params = sum(p.numel() for p in drafter.parameters())
    size = sum(p.numel() * p.element_size() for p in drafter.parameters()) + sum(b.numel() * b.element_size() for b in drafter.buffers())
    t = getattr(cfg, "training", None) or {}
    training = "\n".join(f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in t.items()) or "Not recorded."
    r = getattr(cfg, "results", None)
    results = "\n".join(f"- {k}: {v}" for k, v in r.items()) if isinstance(r, dict) else (r or "See the repository's docs/spire.md.")
    vocab = f"; drafting projects onto a {cfg.draft_vocab_size}-token draft vocabulary (FR-Spec)" if cfg.draft_vocab_size else ""
    return _TEMPLATE.format(
        base_model=cfg.base_model_name_or_path or "the target", num_layers=cfg.num_hidden_layers, layers=cfg.target_layers,
        window=cfg.sliding_window, sinks=cfg.num_sink_tokens, vocab=vocab, params=f"{params / 1e6:.1f}M",
        size=f"{size / 2**20:.1f} MiB", k=cfg.num_draft_tokens, top_i=cfg.tree_top_i, nodes=cfg.tree.num_nodes,
        training=training, results=results, usage=usage_snippet(cfg.base_model_name_or_path or "the target", location),
    )  # fmt: skip


def write_model_card(drafter, folder) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(render_model_card(drafter, location=folder), encoding="utf-8")
    return path
