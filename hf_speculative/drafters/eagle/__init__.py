"""EAGLE-1/2/3 drafters (Li et al. 2024, 2024, 2025)."""

from ..lazy import lazy_drafter

__all__, __getattr__ = lazy_drafter(
    "eagle",
    __name__,
    {
        "configuration_eagle": ("EagleConfig", "eagle3_feature_layers"),
        "modeling_eagle": ("EagleDrafter", "EagleOutput", "EagleTreeDrafter", "load_public_checkpoint"),
        "training_eagle": ("EagleDataset", "EagleCollator", "EagleTrainer", "eagle_loss", "train_eagle"),
    },
    config="EagleConfig",
    model="EagleDrafter",
    train_commands=("hf_speculative.commands.train_eagle",),
)
