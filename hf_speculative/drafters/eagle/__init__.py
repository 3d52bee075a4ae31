"""EAGLE-1/2/3 drafters (Li et al. 2024, 2024, 2025): configuration, model and tree drafter; training
(``training_eagle``) is imported on first use, as it pulls in `transformers.Trainer`."""

from ..lazy import lazy_getattr
from .configuration_eagle import EagleConfig, eagle3_feature_layers
from .modeling_eagle import EagleDrafter, EagleOutput, EagleTreeDrafter, load_public_checkpoint

__all__ = [
    "EagleConfig", "EagleDrafter", "EagleOutput", "EagleTreeDrafter", "eagle3_feature_layers", "load_public_checkpoint",
    "EagleDataset", "EagleCollator", "EagleTrainer", "eagle_loss", "train_eagle",
]  # fmt: skip

__getattr__ = lazy_getattr(__name__, {
    "training_eagle": ("EagleDataset", "EagleCollator", "EagleTrainer", "eagle_loss", "train_eagle"),
})
