"""Speculative Streaming (Bhendawade et al., 2024): multi-stream attention in the target's top layers; the
target drafts for itself (`LlamaForSpeculativeStreaming`)."""

from ..lazy import lazy_drafter

__all__, __getattr__ = lazy_drafter(
    "speculative-streaming",
    __name__,
    {
        "configuration_speculative_streaming": ("SpeculativeStreamingConfig", "default_stream_tree"),
        "modeling_speculative_streaming": (
            "LlamaForSpeculativeStreaming",
            "SpeculativeStreamingDrafter",
            "SpeculativeStreamingOutput",
            "SpeculativeStreams",
            "StreamAdapter",
        ),
    },
    config="SpeculativeStreamingConfig",
    model="LlamaForSpeculativeStreaming",
    train_commands=("hf_speculative.commands.train_streaming", "hf_speculative.commands.train_streaming_pruning"),
)
