"""Drafters: one folder per method, all meeting the engine through `hf_speculative.engine.protocol.TreeDrafter`.

Importing this package registers every drafter (`hf_speculative.registry`): the single-module drafters below, and
each folder's own (its ``__init__`` registers it with `lazy.lazy_drafter`), found by importing the subpackages.
Nothing else is imported: every name, a folder's submodules included, loads on first use."""

from __future__ import annotations

import importlib
import pkgutil

from ..registry import register_drafter
from .lazy import lazy_package

PUBLIC = {
    "draft_lm": ("CausalLMDrafter", "layer_cut_draft"),
    "magicdec": ("MagicDecDrafter",),
    "prompt_lookup": ("PromptLookupDrafter",),
    "hybrid": ("HybridDrafter",),
}

__all__, __getattr__ = lazy_package(__name__, PUBLIC)

register_drafter(
    "causal-lm",
    __name__,
    public={"CausalLMDrafter": "draft_lm", "layer_cut_draft": "draft_lm"},
    assistant="draft_lm.causal_lm_assistant",
)
register_drafter("prompt-lookup", __name__, public={"PromptLookupDrafter": "prompt_lookup"})
register_drafter("magicdec", __name__, public={"MagicDecDrafter": "magicdec"})
register_drafter("hybrid", __name__, public={"HybridDrafter": "hybrid"})

for _package in pkgutil.iter_modules(__path__):
    if _package.ispkg:
        importlib.import_module(f".{_package.name}", __name__)
