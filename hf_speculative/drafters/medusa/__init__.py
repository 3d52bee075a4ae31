"""Medusa heads (Cai et al., 2024): configuration, model and tree drafter; training and tree calibration
(``training_medusa``, ``training_medusa2``, ``tree_calibration``) are imported on first use, as they pull in `transformers.Trainer`."""

from .configuration_medusa import MedusaConfig, default_medusa_choices
from .modeling_medusa import MedusaDrafter, MedusaHeadsModel, MedusaOutput, MedusaResBlock

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

_LAZY = {
    "medusa_loss": "training_medusa",
    "medusa_head_losses": "training_medusa",
    "medusa_labels": "training_medusa",
    "MedusaTrainer": "training_medusa",
    "MedusaCollator": "training_medusa",
    "MedusaPositionDataset": "training_medusa",
    "train_medusa": "training_medusa",
    "calibrate_tree": "tree_calibration",
    "head_accuracies": "tree_calibration",
    "expected_acceptance_length": "tree_calibration",
    "MedusaCurveCallback": "tree_calibration",
    "Medusa2Model": "training_medusa2",
    "Medusa2Trainer": "training_medusa2",
    "medusa2_loss": "training_medusa2",
    "lambda0_schedule": "training_medusa2",
    "train_medusa2": "training_medusa2",
    "save_medusa2": "training_medusa2",
    "load_medusa2": "training_medusa2",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
