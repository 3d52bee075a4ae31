"""Drafters: one folder per method, all meeting the engine through `TreeDrafter`. Every name is imported on first
use, so that importing a drafter's configuration loads no drafter."""

from __future__ import annotations

from .lazy import lazy_getattr

__all__ = ["DraftingOptions", "TreeDrafter", "fill_children", "CausalLMDrafter", "layer_cut_draft", "PromptLookupDrafter", "MagicDecDrafter", "resolve_drafter", "match_target"]

__getattr__ = lazy_getattr(__name__, {
    "base": ("DraftingOptions", "TreeDrafter", "fill_children"),
    "draft_lm": ("CausalLMDrafter", "layer_cut_draft"),
    "magicdec": ("MagicDecDrafter",),
    "placement": ("match_target",),
    "prompt_lookup": ("PromptLookupDrafter",),
    "resolve": ("resolve_drafter",),
})  # fmt: skip
