"""SPIRe drafter (Neelam et al. 2025): configuration, model and tree drafter; training (``training_spire``) is
imported on first use, as it pulls in `transformers.Trainer`."""

from ..lazy import lazy_getattr
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

__getattr__ = lazy_getattr(__name__, {
    "training_spire": ("SpireDataset", "SpireCollator", "SpireTrainer", "mixed_loss", "spire_loss", "train_spire"),
})
