"""`enable(model)`: route ``model.generate(..., assistant_model=X)`` to the tree speculative loop.

`enable` swaps the model instance's class for a subclass that puts `SpeculativeGenerationMixin` first in the MRO,
named ``Speculative<Original>`` so ``type(model)`` says what it is; ``save_pretrained`` still writes the original class
in ``architectures``, an enabled model pickles and deep-copies as one, and `disable` restores the original class.
Without an assistant, `generate` is transformers' own, untouched.
"""

from __future__ import annotations

import functools

from transformers import GenerationMixin, PreTrainedModel

from .acceptance import AcceptanceSettings
from .decoding import check_tree_attention, tree_speculative_decoding
from .policy import SpeedPolicy
from .resolve import resolve_drafter

__all__ = ["SpeculativeGenerationMixin", "disable", "enable", "is_enabled"]

_ENABLED_CLASSES: dict[type, type] = {}


class SpeculativeGenerationMixin:
    """Adds tree speculative decoding to ``generate``.

    Extra ``generate`` arguments:
        assistant_model: an hf_speculative drafter, a `TreeDrafter`, or any causal LM with the target's
            vocabulary. Models that draft for themselves (Speculative Streaming) need none. A drafter model in
            another dtype or on another device than this model is moved to this model's, with a warning line
            (`hf_speculative.engine.placement.match_target`).
        speculative_tree (`TreeSpec`): overrides the drafter's own tree for this call (``TreeSpec.chain(k)``
            verifies a single chain like transformers' assisted decoding).
        speculative_acceptance (`str`): ``"exact"`` (default: greedy, or sampling keyed by position, reproducible with
            a seed whatever the steps drafted), ``"rejection"`` (tree rejection sampling over sampled drafts) or
            ``"typical"`` (Medusa 2.3.1, lossy, sampling only); by default the drafter model's config decides
            (`AcceptanceSettings.resolve`).
        speculative_pricing (`bool`): draft only while tree steps are faster than one-token steps on this machine
            (`hf_speculative.engine.step_pricing`; default on, ``HF_SPECULATIVE_PRICING=0`` turns it off). The output is the
            same either way.
    """

    #: marks models that generate speculatively (`hf_speculative.engine.policy.speed_policy` gives them a policy)
    speculative_generation = True

    def generate(
        self,
        inputs=None,
        generation_config=None,
        logits_processor=None,
        stopping_criteria=None,
        prefix_allowed_tokens_fn=None,
        synced_gpus=None,
        assistant_model=None,
        streamer=None,
        **kwargs,
    ):
        speculative_tree = kwargs.pop("speculative_tree", None)
        speculative_acceptance = kwargs.pop("speculative_acceptance", None)
        speculative_pricing = kwargs.pop("speculative_pricing", None)
        speculative = {}  # transformers' own generate without a drafter, else the tree speculative loop
        if assistant_model is None and not hasattr(self, "get_self_drafter"):
            if speculative_tree is not None or speculative_acceptance is not None or speculative_pricing is not None:
                raise ValueError(
                    "speculative_tree / speculative_acceptance / speculative_pricing need an assistant_model (a drafter)"
                )
        else:
            _check_one_sequence(generation_config if generation_config is not None else self.generation_config, kwargs)
            _check_not_empty(inputs if inputs is not None else kwargs.get("input_ids"))
            check_tree_attention(self)
            drafter = resolve_drafter(self, assistant_model)
            speculative["custom_generate"] = functools.partial(
                tree_speculative_decoding,
                drafter=drafter,
                tree=speculative_tree,
                acceptance=AcceptanceSettings.resolve(speculative_acceptance, getattr(assistant_model, "config", None)),
                streamer=streamer,  # generate only forwards custom arguments to a custom decoding callable
                pricing=speculative_pricing,
            )
        return super().generate(
            inputs,
            generation_config,
            logits_processor,
            stopping_criteria,
            prefix_allowed_tokens_fn,
            synced_gpus,
            None,  # assistant_model: none given, or the drafter, which the tree speculative loop runs instead
            streamer,
            **speculative,
            **kwargs,
        )

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' own, with the original class in the config's ``architectures``."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        original = original_class(type(self)).__name__
        if self.config.architectures != [original]:
            self.config.architectures = [original]
            if kwargs.get("is_main_process", True):
                self.config.save_pretrained(save_directory)
        return result

    def __reduce_ex__(self, protocol):
        """Pickles (and deep-copies) as the original class, enabled again on load, with the same state."""
        return (_enabled_instance, (original_class(type(self)),), self.__dict__.copy())


def original_class(cls: type) -> type:
    """The model class an enabled class was made from (``cls`` itself when it is not an enabled class)."""
    return cls.__dict__.get("_hfs_original", cls)


def _enabled_class(cls: type) -> type:
    if cls not in _ENABLED_CLASSES:
        enabled = type(
            f"Speculative{cls.__name__}",
            (SpeculativeGenerationMixin, cls),
            {"__module__": __name__, "_hfs_original": cls},
        )
        _ENABLED_CLASSES[cls] = enabled
    return _ENABLED_CLASSES[cls]


def _enabled_instance(cls: type):
    """An empty instance of the enabled class of ``cls`` (pickle then restores its state)."""
    return cls.__new__(_enabled_class(cls))


def _check_one_sequence(config, kwargs: dict) -> None:
    """Beams and extra return sequences, from the call's arguments or the generation config it merges with (the
    model's saved ``generation_config`` included), are refused by name."""
    for name in ("num_beams", "num_return_sequences"):
        value = kwargs.get(name, getattr(config, name, None))
        if value is not None and value > 1:
            where = "" if name in kwargs else " (set by the generation config)"
            raise ValueError(
                f"tree speculative decoding does not support {name}={value}{where}: it decodes one sequence per "
                f"prompt; pass {name}=1"
            )


def _check_not_empty(input_ids) -> None:
    """An empty prompt or batch has no last token to draft from: say so before transformers fails on a reshape."""
    shape = getattr(input_ids, "shape", None)
    if shape is None or len(shape) == 0:
        return
    if shape[0] == 0:
        raise ValueError(f"input_ids is an empty batch (shape {tuple(shape)}); give at least one prompt")
    if len(shape) > 1 and shape[-1] == 0:
        raise ValueError(
            f"input_ids has no tokens (shape {tuple(shape)}); tree speculative decoding needs a prompt of at "
            "least one token (e.g. the BOS token, or the chat template's prefix)"
        )


def is_enabled(model) -> bool:
    return isinstance(model, SpeculativeGenerationMixin)


def enable(model: PreTrainedModel, kernels: str | None = None, policy: SpeedPolicy | None = None) -> PreTrainedModel:
    """Give a transformers causal LM tree speculative generation (idempotent); returns the same object.

    ``policy`` (`SpeedPolicy`): how the engine's forwards use this machine: kernels, memory budget, kernel table.
    By default a new one, prepared here: it builds this CPU's kernel once (cached per user), checks it against
    ``F.linear``, and measures which kernel is fastest per row count in about two seconds. The default kernels read
    the weights in place: the engine holds no copy of the model. ``kernels="torch"`` (or
    ``HF_SPECULATIVE_KERNELS=torch``) keeps torch's own kernels (shorthand for ``SpeedPolicy(kernels="torch")``).
    Plain ``generate()`` and the model's own forward always run torch's."""
    if policy is None:
        policy = SpeedPolicy.from_env(kernels=kernels or "auto")
    elif kernels is not None and kernels != policy.kernels:
        raise ValueError(
            f"kernels={kernels!r} disagrees with the policy's kernels={policy.kernels!r}; give one of them"
        )
    if not is_enabled(model):
        if not isinstance(model, GenerationMixin):
            raise TypeError(f"enable() needs a transformers model that can generate, got {type(model).__name__}")
        if getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("tree speculative decoding supports decoder-only causal LMs")
        model.__class__ = _enabled_class(type(model))
    previous = model.__dict__.get("_hfs_policy")
    if previous is not None and previous is not policy:
        previous.uninstall(model)
    policy.prepare(model)
    model._hfs_policy = policy
    return model


def disable(model: PreTrainedModel) -> PreTrainedModel:
    """Undo `enable`: the model's original class, no speed policy, no engine forward on its layers; returns it."""
    if is_enabled(model):
        policy = model.__dict__.pop("_hfs_policy", None)
        if policy is not None:
            policy.uninstall(model)
        model.__class__ = original_class(type(model))
    return model
