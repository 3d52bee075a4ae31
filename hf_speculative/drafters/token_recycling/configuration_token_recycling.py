"""Configuration of Token Recycling (Luo et al., "Turning Trash into Treasure", ACL 2025, arXiv 2408.08696)."""

from __future__ import annotations

from transformers import PretrainedConfig

__all__ = ["TokenRecyclingConfig"]


class TokenRecyclingConfig(PretrainedConfig):
    r"""What a saved `TokenRecyclingDrafter` folder's ``config.json`` holds: no network, only the sizes of its adjacency
    matrix and of its trees. ``AutoConfig`` / ``AutoModel.from_pretrained(folder)`` find the drafter by its
    ``model_type`` after ``import hf_speculative``.

    Args:
        num_successors (`int`, defaults to 8):
            k, candidate successors kept per token (columns of the adjacency matrix; the paper's 8).
        max_nodes (`int`, defaults to 48):
            Most drafted nodes of the cost-aware tree.
        max_depth (`int`, defaults to 8):
            Deepest level of the cost-aware tree (and of the measured hit-rate table).
        refresh_every (`int`, defaults to 16):
            Decoding steps between re-choosing the cost-aware tree from the latest hit rates.
        vocab_size (`int`, *optional*):
            Rows of the adjacency matrix: the vocabulary of the target it learnt from (set on first use).
    """

    model_type = "token_recycling"

    def __init__(self, num_successors: int = 8, max_nodes: int = 48, max_depth: int = 8, refresh_every: int = 16,
                 vocab_size: int | None = None, **kwargs):  # fmt: skip
        self.num_successors = int(num_successors)
        self.max_nodes = int(max_nodes)
        self.max_depth = int(max_depth)
        self.refresh_every = int(refresh_every)
        self.vocab_size = vocab_size
        super().__init__(**kwargs)
