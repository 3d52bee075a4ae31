"""EAGLE-1/2/3 drafters (Li et al. 2024, 2024, 2025): configuration, model and tree drafter; training
(``training_eagle``) is imported on first use, as it pulls in `transformers.Trainer`."""

from .configuration_eagle import EagleConfig, eagle3_feature_layers
from .modeling_eagle import EagleDrafter, EagleOutput, EagleTreeDrafter, load_public_checkpoint

__all__ = [
    "EagleConfig",
    "EagleDrafter",
    "EagleOutput",
    "EagleTreeDrafter",
    "eagle3_feature_layers",
    "load_public_checkpoint",
    "EagleDataset",
    "EagleCollator",
    "EagleTrainer",
    "eagle_loss",
    "train_eagle",
]

_LAZY = {
    "EagleDataset": "training_eagle",
    "EagleCollator": "training_eagle",
    "EagleTrainer": "training_eagle",
    "eagle_loss": "training_eagle",
    "train_eagle": "training_eagle",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
