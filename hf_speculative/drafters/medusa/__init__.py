"""Medusa heads (Cai et al., 2024): configuration; model and tree drafter (``modeling_*``) and training and tree calibration
(``training_medusa``, ``training_medusa2``, ``tree_calibration``) are imported on first use."""

from ..lazy import lazy_getattr
from .configuration_medusa import MedusaConfig, default_medusa_choices

__all__ = [
    "MedusaConfig",
    "MedusaHeadsModel",
    "MedusaDrafter",
    "MedusaOutput",
    "MedusaResBlock",
    "default_medusa_choices",
    "medusa_loss",
    "MedusaTrainer",
    "train_medusa",
    "calibrate_tree",
    "head_accuracies",
    "Medusa2Model",
    "Medusa2Trainer",
    "medusa2_loss",
    "train_medusa2",
    "save_medusa2",
    "load_medusa2",
]

__getattr__ = lazy_getattr(__name__, {
    "modeling_medusa": ("MedusaDrafter", "MedusaHeadsModel", "MedusaOutput", "MedusaResBlock",),
    "training_medusa": ("medusa_loss", "medusa_head_losses", "medusa_labels", "MedusaTrainer", "MedusaCollator",
                        "MedusaPositionDataset", "train_medusa"),
    "tree_calibration": ("calibrate_tree", "head_accuracies", "expected_acceptance_length", "MedusaCurveCallback"),
    "training_medusa2": ("Medusa2Model", "Medusa2Trainer", "medusa2_loss", "lambda0_schedule", "train_medusa2", "save_medusa2",
                         "load_medusa2"),
})  # fmt: skip
