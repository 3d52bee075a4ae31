"""Configuration of Token Recycling (Luo et al., "Turning Trash into Treasure", ACL 2025, arXiv 2408.08696)."""

from __future__ import annotations

from ..configuration_drafter import ModelFreeDrafterConfig

__all__ = ["TokenRecyclingConfig"]


class TokenRecyclingConfig(ModelFreeDrafterConfig):
    r"""What a saved `TokenRecyclingDrafter` folder's ``config.json`` holds: no network, only the sizes of its adjacency
    matrix and of its trees. ``AutoConfig`` / ``AutoModel.from_pretrained(folder)`` find the drafter by its
    ``model_type`` after ``import hf_speculative``. Besides the fields of `ModelFreeDrafterConfig` (``max_nodes``
    defaults to 48, ``max_depth`` to 8; ``vocab_size`` is the number of rows of the adjacency matrix):

    Args:
        num_successors (`int`, defaults to 8):
            k, candidate successors kept per token (columns of the adjacency matrix; the paper's 8).
        refresh_every (`int`, defaults to 16):
            Decoding steps between re-choosing the cost-aware tree from the latest hit rates.
    """

    model_type = "token_recycling"
    default_max_nodes, default_max_depth = 48, 8

    def __init__(self, num_successors: int = 8, refresh_every: int = 16, **kwargs):
        if num_successors < 1 or refresh_every < 1:
            raise ValueError(f"num_successors and refresh_every must be >= 1, got {num_successors}, {refresh_every}")
        self.num_successors = int(num_successors)
        self.refresh_every = int(refresh_every)
        super().__init__(**kwargs)
