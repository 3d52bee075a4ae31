"""Token Recycling (Luo et al., arXiv 2408.08696): configuration (``configuration_token_recycling``) and the drafter
with its adjacency matrix (``modeling_token_recycling``), imported on first use. Importing the package registers
the drafter (`hf_speculative.registry`)."""

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
