"""ParallelSpec drafter (Xiao et al., 2024): configuration; model and tree drafter (``modeling_*``) and training
(``training_parallel_drafter``) are imported on first use."""

from ..lazy import lazy_getattr
from .configuration_parallel_drafter import ParallelDrafterConfig, default_parallel_choices

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
    "modeling_parallel_drafter": ("ParallelDrafter", "ParallelDrafterOutput", "ParallelTreeDrafter",),
    "training_parallel_drafter": ("group_layout", "parallel_loss", "parallel_depth_losses", "ParallelGroupDataset",
                                  "ParallelGroupCollator", "ParallelDrafterTrainer", "train_parallel_drafter",
                                  "depth_accuracies", "calibrate_tree"),
})  # fmt: skip
