"""Medusa heads (Cai et al., 2024): configuration (``configuration_medusa``), model and tree drafter
(``modeling_medusa``), training and tree calibration (``training_medusa``, ``training_medusa2``, ``tree_calibration``),
all imported on first use. Importing the package registers the drafter (`hf_speculative.registry`)."""

from ..lazy import lazy_drafter

__all__, __getattr__ = lazy_drafter(
    "medusa",
    __name__,
    {
        "configuration_medusa": ("MedusaConfig", "default_medusa_choices"),
        "modeling_medusa": ("MedusaDrafter", "MedusaHeadsModel", "MedusaOutput", "MedusaResBlock"),
        "training_medusa": (
            "medusa_loss",
            "medusa_head_losses",
            "medusa_labels",
            "MedusaTrainer",
            "MedusaCollator",
            "MedusaPositionDataset",
            "train_medusa",
        ),
        "tree_calibration": ("calibrate_tree", "head_accuracies", "expected_acceptance_length", "MedusaCurveCallback"),
        "training_medusa2": (
            "Medusa2Model",
            "Medusa2Trainer",
            "medusa2_loss",
            "lambda0_schedule",
            "train_medusa2",
            "save_medusa2",
            "load_medusa2",
        ),
    },
    config="MedusaConfig",
    model="MedusaHeadsModel",
    train_commands=("hf_speculative.commands.train_medusa",),
)
