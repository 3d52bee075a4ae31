"""Speculative Streaming (Bhendawade et al., 2024): multi-stream attention in the target's top layers; the
target drafts for itself (`LlamaForSpeculativeStreaming`)."""

from .configuration_speculative_streaming import SpeculativeStreamingConfig, default_stream_tree
from .modeling_speculative_streaming import (
    LlamaForSpeculativeStreaming,
    SpeculativeStreamingDrafter,
    SpeculativeStreamingOutput,
    SpeculativeStreams,
    StreamAdapter,
)

__all__ = [
    "SpeculativeStreamingConfig",
    "default_stream_tree",
    "LlamaForSpeculativeStreaming",
    "SpeculativeStreamingDrafter",
    "SpeculativeStreamingOutput",
    "SpeculativeStreams",
    "StreamAdapter",
]
