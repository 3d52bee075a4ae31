"""ParallelSpec drafter (Xiao et al., 2024)."""

from ..lazy import lazy_drafter

__all__, __getattr__ = lazy_drafter(
    "parallel",
    __name__,
    {
        "configuration_parallel_drafter": ("ParallelDrafterConfig", "default_parallel_choices"),
        "modeling_parallel_drafter": ("ParallelDrafter", "ParallelDrafterOutput", "ParallelTreeDrafter"),
        "training_parallel_drafter": (
            "group_layout",
            "parallel_loss",
            "parallel_depth_losses",
            "ParallelGroupDataset",
            "ParallelGroupCollator",
            "ParallelDrafterTrainer",
            "train_parallel_drafter",
            "depth_accuracies",
            "calibrate_tree",
        ),
    },
    config="ParallelDrafterConfig",
    model="ParallelDrafter",
    train_commands=("hf_speculative.commands.train_parallel_drafter",),
)
