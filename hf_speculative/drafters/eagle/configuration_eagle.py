"""Configuration of the EAGLE drafters (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", 2024; "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", 2024; "EAGLE-3:
Scaling up Inference Acceleration of Large Language Models via Training-Time Test", 2025)."""

from __future__ import annotations

from transformers import LlamaConfig

from ...engine.trees import DynamicTree, TreeSpec
from ..configuration_drafter import DrafterConfigMixin

__all__ = ["EagleConfig", "eagle3_feature_layers", "VARIANTS"]

VARIANTS = ("eagle1", "eagle2", "eagle3")


def eagle3_feature_layers(num_target_layers: int) -> list[int]:
    """EAGLE-3's low, mid and high target features as ``output_hidden_states`` indices: the inputs of decoder
    layers 2, L // 2 and L - 3, which the reference code (and vLLM's / SGLang's ``aux_hidden_state_layers``)
    collect inside the layer loop before calling those layers. ``hidden_states[i]`` in transformers is the input of
    layer i (``hidden_states[0]`` the embedding output), so the indices are the same numbers."""
    L = int(num_target_layers)
    return [min(2, L - 1), L // 2, max(L - 3, 0)]


class EagleConfig(DrafterConfigMixin, LlamaConfig):
    r"""Configuration of an `EagleDrafter`: the fields of a `LlamaConfig` (the drafter's one decoder layer, as the
    public checkpoints' ``config.json`` writes them) plus the EAGLE settings and those of `DrafterConfigMixin`
    (``base_model_name_or_path``, ``draft_vocab_size``: for EAGLE-3 as below).

    Args:
        variant (`str`, defaults to `"eagle3"`):
            `"eagle1"` / `"eagle2"` (one architecture, EAGLE Sec. 4: ``fc`` over [token embedding ; target feature]
            of width 2H, one decoder layer without input norm, the target's ``lm_head``; EAGLE-2 only adds the
            dynamic tree) or `"eagle3"` (EAGLE-3 Sec. 3: ``fc`` over three target layers' features of width 3H,
            a ``midlayer`` attending over [normed embedding ; normed feature] of width 2H, ``norm`` and an own
            ``lm_head`` over the draft vocabulary).
        draft_vocab_size (`int`, *optional*):
            EAGLE-3: the rows of the drafter's own ``lm_head``; draft id d is target id ``d + d2t[d]``. Defaults to
            ``vocab_size``.
        target_layers (`list[int]`, *optional*):
            The target's ``output_hidden_states`` indices the drafter reads: EAGLE-3's [low, mid, high] (default
            `eagle3_feature_layers`), EAGLE-1/2's final post-norm state (default ``[target_num_layers]``). `None`:
            resolved from the target when it is attached (public checkpoints do not record them).
        target_num_layers (`int`, *optional*): the target's ``num_hidden_layers`` (recorded when known).
        target_hidden_size (`int`, *optional*): the width of one target feature (default ``hidden_size``).
        fc_bias (`bool`, defaults to `False`): whether ``fc`` has a bias (EAGLE-1's Vicuna/LLaMA-2 checkpoints do).
        qkv_bias (`bool`, *optional*): biases on q/k/v (Qwen2-style); default ``attention_bias``.
        total_tokens, tree_depth, tree_top_k (`int`, default 24, 5, 4):
            EAGLE-2's dynamic tree (Sec. 4): expand the ``tree_top_k`` best nodes per depth down to ``tree_depth``,
            keep the ``total_tokens`` nodes of highest path confidence. The drafter's default tree.
        tree_choices (`list[list[int]]`, *optional*): a static tree (Medusa-style paths) to use instead.
        feature_noise (`float`, defaults to 0.0): training only, EAGLE Sec. 4.3: uniform noise of this half width
            added to the target features.
        context_tokens (`bool`, defaults to `True`): EAGLE-3 with a ``draft_vocab_size``: while drafting, the
            prompt's tokens outside the draft vocabulary join it, scored with the target's ``lm_head`` rows (names
            and values a task copies from its prompt stay draftable).
    """

    model_type = "eagle_drafter"

    def __init__(
        self,
        variant: str = "eagle3",
        target_layers: list[int] | None = None,
        target_num_layers: int | None = None,
        target_hidden_size: int | None = None,
        fc_bias: bool = False,
        qkv_bias: bool | None = None,
        total_tokens: int = 24,
        tree_depth: int = 5,
        tree_top_k: int = 4,
        tree_choices: list[list[int]] | None = None,
        feature_noise: float = 0.0,
        num_hidden_layers: int = 1,
        context_tokens: bool = True,
        **kwargs,
    ):
        if variant == "eagle":
            variant = "eagle1"
        if variant not in VARIANTS:
            raise ValueError(f"EagleConfig.variant must be one of {VARIANTS}, got {variant!r}")
        self.variant = variant
        self.target_layers = None if target_layers is None else [int(i) for i in target_layers]
        if self.target_layers is not None and len(self.target_layers) != (3 if variant == "eagle3" else 1):
            raise ValueError(
                f"{variant} reads {3 if variant == 'eagle3' else 1} target layers, got target_layers={target_layers}"
            )
        self.target_num_layers = target_num_layers
        self.target_hidden_size = target_hidden_size
        self.fc_bias = bool(fc_bias)
        self.qkv_bias = qkv_bias
        self.total_tokens, self.tree_depth, self.tree_top_k = int(total_tokens), int(tree_depth), int(tree_top_k)
        self.tree_choices = None if tree_choices is None else TreeSpec.from_choices(tree_choices).to_list()
        self.feature_noise = float(feature_noise)
        self.context_tokens = bool(context_tokens)
        for key in ("bos_token_id", "eos_token_id"):
            kwargs.setdefault(key, None)
        super().__init__(num_hidden_layers=num_hidden_layers, **kwargs)

    @property
    def is_eagle3(self) -> bool:
        return self.variant == "eagle3"

    @property
    def use_qkv_bias(self) -> bool:
        return bool(self.attention_bias if self.qkv_bias is None else self.qkv_bias)

    def feature_layers(self, num_target_layers: int | None = None) -> list[int]:
        """The target's ``output_hidden_states`` indices to read (see ``target_layers``)."""
        if self.target_layers is not None:
            return list(self.target_layers)
        n = num_target_layers or self.target_num_layers
        if n is None:
            raise ValueError("the target's number of layers is unknown: attach the target (base_model=...)")
        return eagle3_feature_layers(n) if self.is_eagle3 else [int(n)]

    @property
    def tree(self) -> TreeSpec:
        """The default draft tree: ``tree_choices`` when set, else EAGLE-2's `DynamicTree`."""
        if self.tree_choices:
            return TreeSpec.from_choices(self.tree_choices)
        return DynamicTree(total_tokens=self.total_tokens, depth=self.tree_depth, top_k=self.tree_top_k)
