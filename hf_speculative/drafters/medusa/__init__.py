"""Medusa heads (Cai et al., 2024): Medusa-1 (frozen target, ``training_medusa``), Medusa-2 (LoRA backbone and
heads jointly, ``training_medusa2``) and tree calibration (``tree_calibration``)."""

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
            "Lambda0Schedule",
            "train_medusa2",
            "save_medusa2",
            "load_medusa2",
        ),
    },
    config="MedusaConfig",
    model="MedusaHeadsModel",
    train_commands=("hf_speculative.commands.train_medusa",),
)
