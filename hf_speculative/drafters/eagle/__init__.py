"""EAGLE-1/2/3 drafters (Li et al. 2024, 2024, 2025): configuration; model and tree drafter (``modeling_*``) and training
(``training_eagle``) are imported on first use."""

from ..lazy import lazy_getattr
from .configuration_eagle import EagleConfig, eagle3_feature_layers

__all__ = [
    "EagleConfig", "EagleDrafter", "EagleOutput", "EagleTreeDrafter", "eagle3_feature_layers", "load_public_checkpoint",
    "EagleDataset", "EagleCollator", "EagleTrainer", "eagle_loss", "train_eagle",
]  # fmt: skip

__getattr__ = lazy_getattr(__name__, {
    "modeling_eagle": ("EagleDrafter", "EagleOutput", "EagleTreeDrafter", "load_public_checkpoint",),
    "training_eagle": ("EagleDataset", "EagleCollator", "EagleTrainer", "eagle_loss", "train_eagle"),
})
