"""Medusa heads (Cai et al., 2024): configuration (``configuration_medusa``), model and tree drafter
(``modeling_medusa``), training and tree calibration (``training_medusa``, ``training_medusa2``, ``tree_calibration``),
all imported on first use. Importing the package registers the drafter (`hf_speculative.registry`)."""

from ...registry import register_drafter
from ..lazy import lazy_package

PUBLIC = {
    "configuration_medusa": ("MedusaConfig", "default_medusa_choices"),
    "modeling_medusa": ("MedusaDrafter", "MedusaHeadsModel", "MedusaOutput", "MedusaResBlock"),
    "training_medusa": ("medusa_loss", "medusa_head_losses", "medusa_labels", "MedusaTrainer", "MedusaCollator",
                        "MedusaPositionDataset", "train_medusa"),
    "tree_calibration": ("calibrate_tree", "head_accuracies", "expected_acceptance_length", "MedusaCurveCallback"),
    "training_medusa2": ("Medusa2Model", "Medusa2Trainer", "medusa2_loss", "lambda0_schedule", "train_medusa2", "save_medusa2",
                         "load_medusa2"),
}  # fmt: skip

__all__, __getattr__ = lazy_package(__name__, PUBLIC)

register_drafter(
    "medusa", __name__,
    config="configuration_medusa.MedusaConfig", model="modeling_medusa.MedusaHeadsModel",
    train_commands=("hf_speculative.commands.train_medusa",),
)  # fmt: skip
