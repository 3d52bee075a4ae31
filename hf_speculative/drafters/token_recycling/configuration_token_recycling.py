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

    def __init__(
        self,
        num_successors: int = 8,
        max_nodes: int = 48,
        max_depth: int = 8,
        refresh_every: int = 16,
        vocab_size: int | None = None,
        **kwargs,
    ):
        self.num_successors = int(num_successors)
        self.refresh_every = int(refresh_every)
        super().__init__(max_nodes=max_nodes, max_depth=max_depth, vocab_size=vocab_size, **kwargs)
