"""Speculative Streaming (Bhendawade et al., 2024): multi-stream attention in the target's top layers; the
target drafts for itself (`LlamaForSpeculativeStreaming`). Configuration here; the model is imported on first use."""

from .configuration_speculative_streaming import SpeculativeStreamingConfig, default_stream_tree
from ..lazy import lazy_getattr

__all__ = [
    "SpeculativeStreamingConfig",
    "default_stream_tree",
    "LlamaForSpeculativeStreaming",
    "SpeculativeStreamingDrafter",
    "SpeculativeStreamingOutput",
    "SpeculativeStreams",
    "StreamAdapter",
]

__getattr__ = lazy_getattr(__name__, {
    "modeling_speculative_streaming": ("LlamaForSpeculativeStreaming", "SpeculativeStreamingDrafter", "SpeculativeStreamingOutput",
                                       "SpeculativeStreams", "StreamAdapter"),
})  # fmt: skip
