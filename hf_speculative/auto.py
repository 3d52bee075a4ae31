"""The drafters in transformers' Auto classes, without importing a drafter.

``AutoConfig.register`` needs each drafter's config class (configuration modules are light); ``AutoModel.register``
gets a stand-in per model class (`lazy_model_class`) that imports the modeling module on the first
``from_pretrained`` / ``from_config`` and then puts the real class in its place.
"""

from __future__ import annotations

from .registry import drafter_entries, load_object

__all__ = ["lazy_model_class", "register_auto_classes"]


def lazy_model_class(config_class: type, dotted: str) -> type:
    """A stand-in for the model class ``dotted`` (``package.module.Name``) in ``AutoModel``'s registry: its
    ``from_pretrained`` and ``from_config`` import the real class, register it in the stand-in's place and hand over."""
    module, _, name = dotted.rpartition(".")

    def load() -> type:
        from transformers import AutoModel

        real = load_object(dotted)
        AutoModel.register(config_class, real, exist_ok=True)
        return real

    def from_pretrained(cls, *args, **kwargs):
        return load().from_pretrained(*args, **kwargs)

    def from_config(cls, *args, **kwargs):
        return load()._from_config(*args, **kwargs)

    namespace = {
        "__doc__": f"Stand-in for `{name}` until its module is imported.",
        "__module__": module,
        "config_class": config_class,
        "from_pretrained": classmethod(from_pretrained),
        "_from_config": classmethod(from_config),
        "from_config": classmethod(from_config),
    }
    return type(name, (), namespace)


def register_auto_classes() -> None:
    """Register every registered drafter's config and model (`hf_speculative.registry`) with ``AutoConfig`` /
    ``AutoModel`` through their own ``register`` calls (idempotent; a model class already imported is registered as
    itself). Nothing of transformers is replaced."""
    import sys

    from transformers import AutoConfig, AutoModel

    for entry in drafter_entries():
        if entry.config is None or entry.model is None:
            continue
        config = entry.load(entry.config)
        AutoConfig.register(config.model_type, config, exist_ok=True)
        dotted = entry.qualified(entry.model)
        module, _, name = dotted.rpartition(".")
        loaded = sys.modules.get(module)
        model = getattr(loaded, name) if loaded is not None else lazy_model_class(config, dotted)
        AutoModel.register(config, model, exist_ok=True)
