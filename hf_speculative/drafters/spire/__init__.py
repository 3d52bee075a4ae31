"""SPIRe drafter (Neelam et al. 2025): configuration (``configuration_spire``), model and tree drafter
(``modeling_spire``) and training (``training_spire``), all imported on first use. Importing the package registers
the drafter (`hf_speculative.registry`)."""

from ...registry import register_drafter
from ..lazy import lazy_package

PUBLIC = {
    "configuration_spire": ("SpireConfig", "chain_with_alternatives"),
    "modeling_spire": ("SpireDrafter", "SpireOutput", "SpireTreeDrafter"),
    "training_spire": ("SpireDataset", "SpireCollator", "SpireTrainer", "mixed_loss", "spire_loss", "train_spire"),
}

__all__, __getattr__ = lazy_package(__name__, PUBLIC)

register_drafter(
    "spire", __name__,
    config="configuration_spire.SpireConfig", model="modeling_spire.SpireDrafter",
    train_commands=("hf_speculative.commands.train_spire",),
)  # fmt: skip
