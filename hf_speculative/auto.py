"""The drafters in transformers' Auto classes, without importing a drafter.

``AutoConfig.register`` needs each drafter's config class (configuration modules are light); ``AutoModel.register``
gets a stand-in per model class (`lazy_model_class`) that imports the modeling module on the first
``from_pretrained`` / ``from_config`` and then puts the real class in its place.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DRAFTER_CLASSES", "lazy_model_class", "register_auto_classes"]

#: (configuration module, config class, modeling module, model class) of every drafter ``AutoModel`` loads
DRAFTER_CLASSES = (
    ("drafters.medusa.configuration_medusa", "MedusaConfig", "drafters.medusa.modeling_medusa", "MedusaHeadsModel"),
    ("drafters.streaming.configuration_speculative_streaming", "SpeculativeStreamingConfig",
     "drafters.streaming.modeling_speculative_streaming", "LlamaForSpeculativeStreaming"),
    ("drafters.parallel.configuration_parallel_drafter", "ParallelDrafterConfig",
     "drafters.parallel.modeling_parallel_drafter", "ParallelDrafter"),
    ("drafters.eagle.configuration_eagle", "EagleConfig", "drafters.eagle.modeling_eagle", "EagleDrafter"),
    ("drafters.spire.configuration_spire", "SpireConfig", "drafters.spire.modeling_spire", "SpireDrafter"),
    ("drafters.suffix.configuration_suffix", "SuffixConfig", "drafters.suffix.modeling_suffix", "SuffixDrafter"),
    ("drafters.configuration_token_recycling", "TokenRecyclingConfig", "drafters.token_recycling", "TokenRecyclingDrafter"),
)  # fmt: skip


def _import(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f".{module}", __package__), name)


def lazy_model_class(config_class: type, module: str, name: str) -> type:
    """A stand-in for the model class ``name`` of ``module`` in ``AutoModel``'s registry: its ``from_pretrained`` and
    ``from_config`` import the real class, register it in the stand-in's place and hand over."""

    def load() -> type:
        from transformers import AutoModel

        real = _import(module, name)
        AutoModel.register(config_class, real, exist_ok=True)
        return real

    def from_pretrained(cls, *args, **kwargs):
        return load().from_pretrained(*args, **kwargs)

    def from_config(cls, *args, **kwargs):
        return load()._from_config(*args, **kwargs)

    namespace = {
        "__doc__": f"Stand-in for `{name}` until its module is imported.",
        "__module__": f"{__package__}.{module}",
        "config_class": config_class,
        "from_pretrained": classmethod(from_pretrained),
        "_from_config": classmethod(from_config),
        "from_config": classmethod(from_config),
    }
    return type(name, (), namespace)


def register_auto_classes() -> None:
    """Register every drafter's config and model with ``AutoConfig`` / ``AutoModel`` through their own ``register``
    calls (idempotent; a model class already imported is registered as itself). Nothing of transformers is replaced."""
    import sys

    from transformers import AutoConfig, AutoModel

    for config_module, config_name, model_module, model_name in DRAFTER_CLASSES:
        config = _import(config_module, config_name)
        AutoConfig.register(config.model_type, config, exist_ok=True)
        loaded = sys.modules.get(f"{__package__}.{model_module}")
        model = getattr(loaded, model_name) if loaded is not None else lazy_model_class(config, model_module, model_name)
        AutoModel.register(config, model, exist_ok=True)
