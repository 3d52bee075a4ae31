"""hf_speculative: tree speculative decoding behind ``model.generate(assistant_model=...)``.

    import hf_speculative as hfs
    hfs.enable(model)
    out = model.generate(input_ids, assistant_model=drafter, max_new_tokens=128)

``import hf_speculative`` registers the drafters with transformers' Auto classes, so that
``AutoModel.from_pretrained(folder)`` finds them: their configs, and stand-ins that import a drafter's modeling
module when it is first loaded (`auto`). The public names below are imported on first use, so the import loads no
drafter. The ``hf-speculative`` command registers after parsing its arguments instead, as ``--help`` must not
import torch.
"""

from __future__ import annotations

import importlib
import os
import sys

__version__ = "0.1.0"

#: public name -> the submodule that defines it
_PUBLIC = {
    "enable": "generation",
    "is_enabled": "generation",
    "SpeculativeGenerationMixin": "generation",
    "TreeSpec": "trees",
    "DraftTree": "trees",
    "DynamicTree": "trees",
    "TreeDrafter": "drafters",
    "DraftingOptions": "drafters",
    "CausalLMDrafter": "drafters",
    "layer_cut_draft": "drafters",
    "PromptLookupDrafter": "drafters",
    "MagicDecDrafter": "drafters",
    "TokenRecyclingDrafter": "drafters.token_recycling",
    "SuffixConfig": "drafters.suffix",
    "SuffixDrafter": "drafters.suffix",
    "HybridDrafter": "drafters.hybrid",
    "MedusaConfig": "drafters.medusa",
    "MedusaHeadsModel": "drafters.medusa",
    "SpeculativeStreamingConfig": "drafters.streaming",
    "LlamaForSpeculativeStreaming": "drafters.streaming",
    "ParallelDrafterConfig": "drafters.parallel",
    "ParallelDrafter": "drafters.parallel",
    "EagleConfig": "drafters.eagle",
    "EagleDrafter": "drafters.eagle",
    "SpireConfig": "drafters.spire",
    "SpireDrafter": "drafters.spire",
    "SpeculativeStats": "decoding",
    "SpeculativeGenerateOutput": "decoding",
    "AcceptanceResult": "acceptance",
    "accept_greedy": "acceptance",
    "accept_sampling": "acceptance",
    "accept_typical": "acceptance",
}

__all__ = [*_PUBLIC, "register_auto_classes"]

from .auto import register_auto_classes  # noqa: E402


def __getattr__(name: str):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))


def _invoked_as_cli() -> bool:
    """True when this process is the ``hf-speculative`` command (the console script or ``python -m
    hf_speculative.cli``), read from the interpreter's original arguments."""
    argv = getattr(sys, "orig_argv", [])
    if "-m" in argv:
        return argv[argv.index("-m") + 1 : argv.index("-m") + 2] == ["hf_speculative.cli"]
    return len(argv) > 1 and os.path.basename(argv[1]).startswith("hf-speculative")


if not _invoked_as_cli():
    register_auto_classes()
