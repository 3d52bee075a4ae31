"""hf_speculative: tree speculative decoding behind ``model.generate(assistant_model=...)``.

    import hf_speculative as hfs
    hfs.enable(model)
    out = model.generate(input_ids, assistant_model=drafter, max_new_tokens=128)

``import hf_speculative`` registers the drafters (each in its own package, `registry`) with transformers' Auto
classes, so that ``AutoModel.from_pretrained(folder)`` finds them: their configs, and stand-ins that import a
drafter's modeling module when it is first loaded (`auto`). The public names (the engine's below, each drafter's
from its registration) are imported on first use, so the import loads no drafter. The ``hf-speculative`` command
registers after parsing its arguments instead, as ``--help`` must not import torch.
"""

from __future__ import annotations

import importlib
import os
import sys

__version__ = "0.1.0"

#: the engine's public names -> the submodule that defines them; each drafter's come from its registration
_ENGINE = {
    "enable": "engine.generation",
    "disable": "engine.generation",
    "is_enabled": "engine.generation",
    "SpeedPolicy": "engine.policy",
    "SpeculativeGenerationMixin": "engine.generation",
    "TreeSpec": "engine.trees",
    "DraftTree": "engine.trees",
    "DynamicTree": "engine.trees",
    "DraftingOptions": "engine.trees",
    "TreeDrafter": "engine.protocol",
    "OneRowDrafter": "engine.protocol",
    "DrafterCapabilities": "engine.protocol",
    "SpeculativeStats": "engine.decoding",
    "SpeculativeGenerateOutput": "engine.decoding",
    "AcceptanceResult": "engine.acceptance",
    "accept_greedy": "engine.acceptance",
    "accept_sampling": "engine.acceptance",
    "accept_typical": "engine.acceptance",
}

from . import drafters as drafters  # noqa: E402  (imported for its side effect: registers every drafter, imports none)
from .auto import register_auto_classes  # noqa: E402
from .registry import drafter_entries, register_drafter  # noqa: E402


def _public() -> dict[str, str]:
    """Every public name -> the full name of the module that defines it."""
    names = {name: f"{__name__}.{module}" for name, module in _ENGINE.items()}
    for entry in drafter_entries():
        names.update({name: entry.qualified(module) for name, module in entry.public.items()})
    return names


__all__ = [
    *_ENGINE,
    *(name for entry in drafter_entries() for name in entry.public),
    "register_auto_classes",
    "register_drafter",
]


def __getattr__(name: str):
    public = _public()
    if name in public:
        value = getattr(importlib.import_module(public[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_public()))


def _invoked_as_cli() -> bool:
    """True when this process is the ``hf-speculative`` command (the console script or ``python -m
    hf_speculative.cli``), read from the interpreter's original arguments."""
    argv = getattr(sys, "orig_argv", [])
    if "-m" in argv:
        return argv[argv.index("-m") + 1 : argv.index("-m") + 2] == ["hf_speculative.cli"]
    return len(argv) > 1 and os.path.basename(argv[1]).startswith("hf-speculative")


if not _invoked_as_cli():
    register_auto_classes()
