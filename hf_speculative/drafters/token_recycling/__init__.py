"""Token Recycling (Luo et al., arXiv 2408.08696): the drafter with its adjacency matrix."""

from ..lazy import lazy_drafter

__all__, __getattr__ = lazy_drafter(
    "token-recycling",
    __name__,
    {
        "configuration_token_recycling": ("TokenRecyclingConfig",),
        "modeling_token_recycling": ("TokenRecyclingDrafter",),
    },
    config="TokenRecyclingConfig",
    model="TokenRecyclingDrafter",
)
