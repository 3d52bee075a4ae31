"""ParallelSpec drafter (Xiao et al., 2024): configuration (``configuration_parallel_drafter``), model and tree
drafter (``modeling_parallel_drafter``) and training (``training_parallel_drafter``), all imported on first use.
Importing the package registers the drafter (`hf_speculative.registry`)."""

from ...registry import register_drafter
from ..lazy import lazy_package

PUBLIC = {
    "configuration_parallel_drafter": ("ParallelDrafterConfig", "default_parallel_choices"),
    "modeling_parallel_drafter": ("ParallelDrafter", "ParallelDrafterOutput", "ParallelTreeDrafter"),
    "training_parallel_drafter": ("group_layout", "parallel_loss", "parallel_depth_losses", "ParallelGroupDataset",
                                  "ParallelGroupCollator", "ParallelDrafterTrainer", "train_parallel_drafter",
                                  "depth_accuracies", "calibrate_tree"),
}  # fmt: skip

__all__, __getattr__ = lazy_package(__name__, PUBLIC)

register_drafter(
    "parallel", __name__,
    config="configuration_parallel_drafter.ParallelDrafterConfig", model="modeling_parallel_drafter.ParallelDrafter",
    train_commands=("hf_speculative.commands.train_parallel",),
)  # fmt: skip
