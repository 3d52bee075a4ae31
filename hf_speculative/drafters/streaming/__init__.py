"""Speculative Streaming (Bhendawade et al., 2024): multi-stream attention in the target's top layers; the
target drafts for itself (`LlamaForSpeculativeStreaming`). Configuration (``configuration_speculative_streaming``)
and model (``modeling_speculative_streaming``) are imported on first use. Importing the package registers the
drafter (`hf_speculative.registry`)."""

from ...registry import register_drafter
from ..lazy import lazy_package

PUBLIC = {
    "configuration_speculative_streaming": ("SpeculativeStreamingConfig", "default_stream_tree"),
    "modeling_speculative_streaming": ("LlamaForSpeculativeStreaming", "SpeculativeStreamingDrafter",
                                       "SpeculativeStreamingOutput", "SpeculativeStreams", "StreamAdapter"),
}  # fmt: skip

__all__, __getattr__ = lazy_package(__name__, PUBLIC)

register_drafter(
    "speculative-streaming", __name__,
    config="configuration_speculative_streaming.SpeculativeStreamingConfig",
    model="modeling_speculative_streaming.LlamaForSpeculativeStreaming",
    train_commands=("hf_speculative.commands.train_streaming", "hf_speculative.commands.train_streaming_pruning"),
)  # fmt: skip
