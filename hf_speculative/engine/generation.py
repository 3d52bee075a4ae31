"""`enable(model)`: route ``model.generate(..., assistant_model=X)`` to the tree speculative loop.

`enable` swaps the model instance's class for a subclass that puts `SpeculativeGenerationMixin` first
in the MRO (the subclass keeps the original class name, so ``save_pretrained`` writes the same
``architectures``). Without an assistant, `generate` is transformers' own, untouched.
"""

from __future__ import annotations

import functools

from transformers import GenerationMixin, PreTrainedModel

from .acceptance import AcceptanceSettings
from .decoding import check_tree_attention, tree_speculative_decoding
from .policy import SpeedPolicy
from .resolve import resolve_drafter

__all__ = ["SpeculativeGenerationMixin", "enable", "is_enabled"]

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
        speculative_acceptance (`str`): ``"exact"`` (default) or ``"typical"`` (Medusa 2.3.1, lossy, sampling only);
            by default the drafter model's config decides (`AcceptanceSettings.resolve`).
        speculative_pricing (`bool`): draft only while tree steps are faster than one-token steps on this machine
            (`hf_speculative.engine.step_pricing`; default on, ``HF_SPECULATIVE_PRICING=0`` turns it off). The output is the
            same either way.
    """

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
        *,
        speculative_tree=None,
        speculative_acceptance=None,
        speculative_pricing=None,
        **kwargs,
    ):
        if assistant_model is None and not hasattr(self, "get_self_drafter"):
            if speculative_tree is not None or speculative_acceptance is not None or speculative_pricing is not None:
                raise ValueError(
                    "speculative_tree / speculative_acceptance / speculative_pricing need an assistant_model (a drafter)"
                )
            return super().generate(
                inputs,
                generation_config,
                logits_processor,
                stopping_criteria,
                prefix_allowed_tokens_fn,
                synced_gpus,
                assistant_model,
                streamer,
                **kwargs,
            )
        for name in ("num_beams", "num_return_sequences"):
            value = kwargs.get(name, getattr(generation_config, name, None) if generation_config is not None else None)
            if value is not None and value > 1:
                raise ValueError(f"tree speculative decoding does not support {name}={value} (it decodes one sequence)")
        _check_not_empty(inputs if inputs is not None else kwargs.get("input_ids"))
        check_tree_attention(self)
        drafter = resolve_drafter(self, assistant_model)
        decoding = functools.partial(
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
            None,
            streamer,
            custom_generate=decoding,
            **kwargs,
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
        cls = type(model)
        if cls not in _ENABLED_CLASSES:
            _ENABLED_CLASSES[cls] = type(
                cls.__name__, (SpeculativeGenerationMixin, cls), {"__module__": cls.__module__}
            )
            _ENABLED_CLASSES[cls].__qualname__ = cls.__qualname__
        model.__class__ = _ENABLED_CLASSES[cls]
    policy.prepare(model)
    model._hfs_policy = policy
    return model
