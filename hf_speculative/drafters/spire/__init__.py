"""SPIRe drafter (Neelam et al. 2025): configuration; model and tree drafter (``modeling_*``) and training (``training_spire``) are
imported on first use."""

from ..lazy import lazy_getattr
from .configuration_spire import SpireConfig, chain_with_alternatives

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
    "modeling_spire": ("SpireDrafter", "SpireOutput", "SpireTreeDrafter", "sparse_visibility",),
    "training_spire": ("SpireDataset", "SpireCollator", "SpireTrainer", "mixed_loss", "spire_loss", "train_spire"),
})
