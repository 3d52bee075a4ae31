"""Token Recycling (Luo et al., arXiv 2408.08696): configuration (``configuration_token_recycling``) and the drafter
with its adjacency matrix (``modeling_token_recycling``), imported on first use. Importing the package registers
the drafter (`hf_speculative.registry`)."""

from ...registry import register_drafter
from ..lazy import lazy_package

PUBLIC = {
    "configuration_token_recycling": ("TokenRecyclingConfig",),
    "modeling_token_recycling": ("TokenRecyclingDrafter",),
}

__all__, __getattr__ = lazy_package(__name__, PUBLIC)

register_drafter(
    "token-recycling", __name__,
    config="configuration_token_recycling.TokenRecyclingConfig", model="modeling_token_recycling.TokenRecyclingDrafter",
)  # fmt: skip
