"""SuffixDecoding (Oliaro et al., arXiv 2411.04975): the drafter, its suffix structures (``suffix_index``) and its
speculation trees (``speculation_tree``)."""

from ..lazy import lazy_drafter

__all__, __getattr__ = lazy_drafter(
    "suffix",
    __name__,
    {
        "configuration_suffix": ("SuffixConfig",),
        "modeling_suffix": ("SuffixDrafter",),
        "suffix_index": ("SuffixIndex", "match_in_sequence"),
        "speculation_tree": ("expand_speculation_tree",),
    },
    config="SuffixConfig",
    model="SuffixDrafter",
)
