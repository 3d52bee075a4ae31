"""SuffixDecoding (Oliaro et al., arXiv 2411.04975): configuration; the drafter (``modeling_suffix``), its suffix
structures (``suffix_index``) and its speculation trees (``speculation_tree``) are imported on first use."""

from ..lazy import lazy_getattr
from .configuration_suffix import SuffixConfig

__all__ = ["SuffixConfig", "SuffixDrafter", "SuffixIndex", "match_in_sequence", "expand_speculation_tree"]

__getattr__ = lazy_getattr(__name__, {
    "modeling_suffix": ("SuffixDrafter",),
    "suffix_index": ("SuffixIndex", "match_in_sequence"),
    "speculation_tree": ("expand_speculation_tree",),
})  # fmt: skip
