"""`DrafterModel`: the `PreTrainedModel` base of the drafters that share modules with their target (base) model
(Medusa heads, ParallelSpec, EAGLE, SPIRe, Speculative Streaming): building one for a target (`from_base_model`),
loading one with ``from_pretrained(folder, base_model=model)`` and attaching the target (`attach_base_model`).
`DepthTreeDrafter`: the per-call tree drafter of those that fill a static tree with one distribution per depth."""

from __future__ import annotations

import functools

import torch
from transformers import PretrainedConfig, PreTrainedModel

from ..engine.placement import match_target, target_placement
from ..engine.protocol import TreeDrafter
from ..engine.trees import TreeSpec
from ..hub import resolve_name_or_path
from .base import input_embeddings, output_embeddings
from .configuration_drafter import TreeDrafterConfig
from .cost_aware import cost_aware_tree
from .hub import DrafterHubMixin, require_weights

__all__ = ["DrafterModel", "DepthTreeDrafter", "text_config", "decoder_layer_fields"]

#: how `attach_base_model` finds each module a drafter shares with its target
_SHARED_MODULES = {"base_embeddings": input_embeddings, "base_lm_head": output_embeddings}


def text_config(model: PreTrainedModel) -> PretrainedConfig:
    """``model``'s text config (the config itself for a text-only model)."""
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def decoder_layer_fields(model: PreTrainedModel) -> dict:
    """The fields of ``model``'s text config that shape a Llama-style decoder layer (heads, MLP, norm, RoPE), for
    the config of a drafter whose layers are the target's kind (EAGLE, SPIRe)."""
    tc = text_config(model)
    names = (
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "hidden_act",
        "rms_norm_eps",
        "max_position_embeddings",
        "head_dim",
    )
    fields = {k: getattr(tc, k) for k in names if getattr(tc, k, None) is not None}
    rope = getattr(tc, "rope_parameters", None)
    if rope:
        fields["rope_parameters"] = dict(rope)
    return fields


class DrafterModel(DrafterHubMixin, PreTrainedModel):
    """A drafter that uses modules of its target without owning them: by default the token embeddings
    (``base_embeddings``) and the ``lm_head`` (``base_lm_head``), frozen, kept out of the drafter's submodules (never
    saved, moved or trained with it). `attach_base_model` checks a target's shapes and attaches them; it runs in
    `from_base_model`, in ``from_pretrained(folder, base_model=model)`` and when drafting starts (`get_tree_drafter`).

    A subclass's ``from_base_model`` builds its config (with `_base_model_fields`) and calls `_from_base_config`; it
    may override `_init_from_base_model`, `shared_modules`, `_shape_checks` and `_load_checkpoint`, and implements
    `_tree_drafter`.
    """

    #: the attributes `attach_base_model` sets to the target's modules (see `_SHARED_MODULES`)
    shared_modules: tuple[str, ...] = ("base_embeddings", "base_lm_head")

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        for name in _SHARED_MODULES:
            self.__dict__[name] = None  # not submodules: never saved, moved or trained with the drafter

    # ------------------------------------------------------------------ construction
    @classmethod
    def _base_model_fields(cls, model: PreTrainedModel) -> dict:
        """The config fields a drafter takes from its target: ``base_model_name_or_path`` (`None` for a model built
        from a config) and the hidden and vocabulary sizes of its ``lm_head``."""
        vocab, hidden = output_embeddings(model, cls.__name__).weight.shape
        return {
            "base_model_name_or_path": getattr(model.config, "_name_or_path", None) or None,
            "hidden_size": hidden,
            "vocab_size": vocab,
        }

    @classmethod
    def _from_base_config(cls, model: PreTrainedModel, config: PretrainedConfig, init_from_base: bool = True):
        """A new drafter of ``config`` for ``model``: in its dtype and on its device, initialised from it
        (`_init_from_base_model`) when ``init_from_base``, attached, in eval mode."""
        dtype, device = target_placement(model)
        drafter = cls(config).to(device=device, dtype=dtype)
        if init_from_base:
            with torch.no_grad():
                drafter._init_from_base_model(model)
        drafter.attach_base_model(model)
        return drafter.eval()

    def _init_from_base_model(self, model: PreTrainedModel) -> None:
        """Copy what the drafter starts from out of ``model`` (no autograd); by default nothing."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, base_model: PreTrainedModel | None = None, **kwargs):
        """`PreTrainedModel.from_pretrained` (`_load_checkpoint`), plus ``base_model=`` to attach the target at once. A
        folder that does not exist raises `FileNotFoundError` at once (`hf_speculative.hub.resolve_name_or_path`)."""
        path = resolve_name_or_path(pretrained_model_name_or_path, what=cls.__name__)
        drafter = cls._load_checkpoint(path, *args, **kwargs)
        if base_model is not None:
            drafter.attach_base_model(base_model)
        return drafter.eval()

    @classmethod
    def _load_checkpoint(cls, path: str | None, *args, **kwargs):
        """The drafter saved in ``path`` (resolved): `PreTrainedModel.from_pretrained`. A local folder with its config
        and no weights (a card whose weights are not kept) raises `FileNotFoundError` naming the command that rebuilds
        them (`hf_speculative.drafters.hub.require_weights`)."""
        if kwargs.get("state_dict") is None and not kwargs.get("gguf_file"):
            require_weights(path, cls.__name__, kwargs.get("subfolder"))
        return super().from_pretrained(path, *args, **kwargs)

    # ------------------------------------------------------------------ the target
    def attach_base_model(self, model: PreTrainedModel) -> None:
        """Check the target's shapes and share its (frozen) `shared_modules`. Moves the drafter to the target's dtype
        and device (`hf_speculative.engine.placement.match_target`)."""
        shared = {name: _SHARED_MODULES[name](model, type(self).__name__) for name in self.shared_modules}
        self._check_base_model(model)
        self.__dict__.update(shared)
        match_target(self, model)

    def _shape_checks(self, model: PreTrainedModel) -> dict[str, tuple[int, int]]:
        """What the drafter needs of a target: name -> (the value it was built for, ``model``'s). By default the
        ``lm_head``'s hidden and vocabulary sizes."""
        vocab, hidden = output_embeddings(model, type(self).__name__).weight.shape
        return {"hidden_size": (self.config.hidden_size, hidden), "vocab_size": (self.config.vocab_size, vocab)}

    def _check_base_model(self, model: PreTrainedModel) -> None:
        """A `ValueError` naming every `_shape_checks` value when one of them differs."""
        checks = self._shape_checks(model)
        if any(built != found for built, found in checks.values()):
            built = ", ".join(f"{name}={built}" for name, (built, _) in checks.items())
            found = ", ".join(f"{name}={found}" for name, (_, found) in checks.items())
            raise ValueError(
                f"this {type(self).__name__} was built for a target with {built}, but the target has {found}"
            )

    def _require_base(self) -> None:
        """Raise when the target's shared modules are needed and not attached."""
        if any(getattr(self, name) is None for name in self.shared_modules):
            name = type(self).__name__
            raise ValueError(
                f"this {name} shares modules of its target, which are not attached: use "
                f"{name}.from_pretrained(folder, base_model=model) or drafter.attach_base_model(model)"
            )

    # ------------------------------------------------------------------ drafting
    @property
    def tree(self) -> TreeSpec:
        """The drafter's default draft tree (its config's)."""
        return self.config.tree

    def get_tree_drafter(self, target: PreTrainedModel):
        """The per-call drafter the engine uses for ``target.generate(assistant_model=self)``."""
        self.attach_base_model(target)
        return self._tree_drafter(target)

    def _tree_drafter(self, target: PreTrainedModel):
        """The per-call `TreeDrafter` for an attached ``target``."""
        raise NotImplementedError


class DepthTreeDrafter(TreeDrafter):
    """The per-call tree drafter of a model with a `TreeDrafterConfig` (Medusa heads, ParallelSpec) or another config
    with a ``tree`` and a ``vocab_size`` (Speculative Streaming): one distribution per depth fills the static tree.
    The default tree is the config's, or with a calibration (its ``accuracy_key``) the cost-aware one (`hf_speculative.drafters.cost_aware`); the vocabulary is the config's (its acceptance settings
    are the call's default, `hf_speculative.engine.acceptance.AcceptanceSettings.resolve`). A subclass sets what its
    `draft_cost` reads before it calls ``__init__``, and drafts through one path: the batched methods (Medusa heads:
    one head forward over every row) or, mixing in `OneRowDrafter`, the one-row methods (ParallelSpec: a drafter
    cache per row)."""

    #: the calibration's per-depth top-i accuracies
    accuracy_key = "depth_top_i_accuracy"
    fills_dynamic_tree = True  # `DynamicTree.fill` from the per-depth distributions

    def __init__(
        self,
        config: TreeDrafterConfig,
        max_depth: int,
        draft_sampling: str = "without_replacement",
        target: PreTrainedModel | None = None,
    ):
        self.max_depth = max_depth
        self.batch_tree = functools.partial(
            cost_aware_tree, config.tree, config, self.accuracy_key, target, self.draft_cost, max_depth
        )
        self.default_tree = self.batch_tree(batch_size=1)
        self.vocab_size = config.vocab_size
        self.draft_sampling = draft_sampling
