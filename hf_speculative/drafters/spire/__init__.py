"""SPIRe drafter (Neelam et al. 2025): configuration, model and tree drafter; training (``training_spire``) is
imported on first use, as it pulls in `transformers.Trainer`."""

from .configuration_spire import SpireConfig, chain_with_alternatives
from .modeling_spire import SpireDrafter, SpireOutput, SpireTreeDrafter, sparse_visibility

__all__ = [
    "SpireConfig",
    "SpireDrafter",
    "SpireOutput",
    "SpireTreeDrafter",
    "chain_with_alternatives",
    "sparse_visibility",
    "SpireDataset",
    "SpireCollator",
    "SpireTrainer",
    "mixed_loss",
    "spire_loss",
    "train_spire",
]

_LAZY = {name: "training_spire" for name in ("SpireDataset", "SpireCollator", "SpireTrainer", "mixed_loss", "spire_loss", "train_spire")}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
