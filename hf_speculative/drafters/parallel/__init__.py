"""ParallelSpec drafter (Xiao et al., 2024): configuration, model and tree drafter; training
(``training_parallel_drafter``) is imported on first use, as it pulls in `transformers.Trainer`."""

from .configuration_parallel_drafter import ParallelDrafterConfig, default_parallel_choices
from .modeling_parallel_drafter import ParallelDrafter, ParallelDrafterOutput, ParallelTreeDrafter

__all__ = [
    "ParallelDrafterConfig",
    "ParallelDrafter",
    "ParallelDrafterOutput",
    "ParallelTreeDrafter",
    "default_parallel_choices",
    "group_layout",
    "parallel_loss",
    "ParallelDrafterTrainer",
    "train_parallel_drafter",
]

_LAZY = {
    "group_layout": "training_parallel_drafter",
    "parallel_loss": "training_parallel_drafter",
    "parallel_depth_losses": "training_parallel_drafter",
    "ParallelGroupDataset": "training_parallel_drafter",
    "ParallelGroupCollator": "training_parallel_drafter",
    "ParallelDrafterTrainer": "training_parallel_drafter",
    "train_parallel_drafter": "training_parallel_drafter",
    "depth_accuracies": "training_parallel_drafter",
    "calibrate_tree": "training_parallel_drafter",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
