"""hf_speculative: tree speculative decoding behind ``model.generate(assistant_model=...)``.

    import hf_speculative as hfs
    hfs.enable(model)
    out = model.generate(input_ids, assistant_model=drafter, max_new_tokens=128)
"""

from .decoding import SpeculativeGenerateOutput, SpeculativeStats
from .drafters import CausalLMDrafter, DraftingOptions, PromptLookupDrafter, TreeDrafter, layer_cut_draft
from .drafters.medusa import MedusaConfig, MedusaHeadsModel
from .drafters.streaming import LlamaForSpeculativeStreaming, SpeculativeStreamingConfig
from .drafters.parallel import ParallelDrafter, ParallelDrafterConfig
from .generation import SpeculativeGenerationMixin, enable, is_enabled
from .trees import DraftTree, DynamicTree, TreeSpec
from .verify import AcceptanceResult, accept_greedy, accept_sampling, accept_typical

__version__ = "0.1.0"

__all__ = [
    "enable",
    "is_enabled",
    "SpeculativeGenerationMixin",
    "TreeSpec",
    "DynamicTree",
    "DraftTree",
    "TreeDrafter",
    "DraftingOptions",
    "CausalLMDrafter",
    "layer_cut_draft",
    "PromptLookupDrafter",
    "MedusaConfig",
    "MedusaHeadsModel",
    "SpeculativeStreamingConfig",
    "LlamaForSpeculativeStreaming",
    "ParallelDrafterConfig",
    "ParallelDrafter",
    "SpeculativeStats",
    "SpeculativeGenerateOutput",
    "AcceptanceResult",
    "accept_greedy",
    "accept_sampling",
    "accept_typical",
]


def _register_auto_classes() -> None:
    from transformers import AutoConfig, AutoModel

    AutoConfig.register(MedusaConfig.model_type, MedusaConfig, exist_ok=True)
    AutoModel.register(MedusaConfig, MedusaHeadsModel, exist_ok=True)
    AutoConfig.register(SpeculativeStreamingConfig.model_type, SpeculativeStreamingConfig, exist_ok=True)
    AutoModel.register(SpeculativeStreamingConfig, LlamaForSpeculativeStreaming, exist_ok=True)
    AutoConfig.register(ParallelDrafterConfig.model_type, ParallelDrafterConfig, exist_ok=True)
    AutoModel.register(ParallelDrafterConfig, ParallelDrafter, exist_ok=True)


_register_auto_classes()
