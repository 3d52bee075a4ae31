"""SPIRe drafter (Neelam et al. 2025)."""

from ..lazy import lazy_drafter

__all__, __getattr__ = lazy_drafter(
    "spire",
    __name__,
    {
        "configuration_spire": ("SpireConfig", "chain_with_alternatives"),
        "modeling_spire": ("SpireDrafter", "SpireOutput", "SpireTreeDrafter"),
        "training_spire": ("SpireDataset", "SpireCollator", "SpireTrainer", "mixed_loss", "spire_loss", "train_spire"),
    },
    config="SpireConfig",
    model="SpireDrafter",
    train_commands=("hf_speculative.commands.train_spire",),
)
