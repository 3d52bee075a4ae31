"""ParallelSpec drafter (Xiao et al., 2024): configuration, model and tree drafter; training
(``training_parallel_drafter``) is imported on first use, as it pulls in `transformers.Trainer`."""

from ..lazy import lazy_getattr
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

__getattr__ = lazy_getattr(__name__, {
    "training_parallel_drafter": ("group_layout", "parallel_loss", "parallel_depth_losses", "ParallelGroupDataset",
                                  "ParallelGroupCollator", "ParallelDrafterTrainer", "train_parallel_drafter",
                                  "depth_accuracies", "calibrate_tree"),
})  # fmt: skip
