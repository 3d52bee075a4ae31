"""Configuration of the ParallelSpec drafter (Xiao et al., "ParallelSpec: Parallel Drafter for Efficient
Speculative Decoding", 2024, https://arxiv.org/abs/2410.05589)."""

from __future__ import annotations

from transformers import AutoConfig, LlamaConfig, PretrainedConfig

from ...engine.trees import TreeSpec
from ..configuration_drafter import TreeDrafterConfig

__all__ = ["ParallelDrafterConfig", "default_parallel_choices", "MASK_LOSS_DECAY"]

#: lambda_j = MASK_LOSS_DECAY ** j for the j-th mask token's loss (our choice: Medusa's 0.8; ParallelSpec eq. 3
#: weights the k mask losses by lambda_k without fixing a value)
MASK_LOSS_DECAY = 0.8


def default_parallel_choices(num_mask_tokens: int, num_nodes: int = 12) -> list[list[int]]:
    """A small sparse tree (12 nodes) for an uncalibrated drafter: `TreeSpec.optimize` on a prior accuracy table.

    The prior assumes the distribution of depth ``d`` (0-based, ``d = 0`` being the token after the root) has
    top-1 accuracy ``0.6 * 0.75**d`` and that each lower rank is half as likely; `calibrate_tree` in
    ``training_parallel_drafter`` replaces it with the tree built from measured held-out accuracies.
    """
    prior = [[0.6 * 0.75**d * 0.5**i for i in range(8)] for d in range(num_mask_tokens + 1)]
    return TreeSpec.optimize(prior, num_nodes).to_list()


class ParallelDrafterConfig(TreeDrafterConfig):
    r"""Configuration of a `ParallelDrafter`: a small transformer that drafts k + 1 tokens in ONE forward pass
    from the context and k learned [MASK] tokens (ParallelSpec Sec. 3-4).

    The drafter's decoder layers are the target architecture's own (``decoder_config`` is the target's config
    with ``num_hidden_layers = num_layers``); it shares the target's input embedding table and ``lm_head``
    (frozen, never stored in its checkpoint). The input ``[x_c .. x_t, MASK_1 .. MASK_k]`` (mask j at position
    ``t + j``) yields the distributions of ``x_{t+1} .. x_{t+k+1}``: depths 1 .. k + 1 of the draft tree.

    The fields of `TreeDrafterConfig` and `DrafterConfigMixin` come with it: the target (``base_model_name_or_path``),
    an FR-Spec ``draft_vocab_size``, the acceptance settings (``"exact"`` is ParallelSpec's Algorithm 1),
    ``initializer_range`` (the init of the mask embeddings and the fusion layer) and ``cost_aware_tree`` (on
    ``calibration["depth_top_i_accuracy"]``).

    Args:
        decoder_config (`dict`, *optional*):
            The target's config (``to_dict()``, with ``model_type``) that shapes the drafter's decoder layers,
            rotary embedding and final norm. Defaults to a small Llama config of ``hidden_size``.
        hidden_size (`int`, defaults to 576):
            Hidden size of the target (and of the drafter).
        vocab_size (`int`, defaults to 49152):
            Vocabulary size of the target; the drafter refuses a target with another vocabulary. Mask token j
            (0-based) is written as token id ``vocab_size + j`` in the drafter's inputs.
        num_mask_tokens (`int`, defaults to 4):
            k, the number of [MASK] tokens: one forward drafts k + 1 tokens, the deepest tree it can fill.
        num_layers (`int`, defaults to 1):
            Decoder layers of the drafter (ParallelSpec uses one).
        use_target_hidden_states (`bool`, defaults to `False`):
            ParallelSpec Sec. 4.3 (the EAGLE-style integration): a context token ``x_i`` enters the drafter as
            ``W [e(x_i); h_{i-1}]`` where ``h_{i-1}`` is the target's final hidden state at the previous
            position (the state whose ``lm_head`` output was ``x_i``). Mask tokens enter as their embedding.
        init_layer (`int`, *optional*):
            Index of the target decoder layer the drafter's layer was initialised from (recorded only).
        parallel_choices (`list[list[int]]`, *optional*):
            The static draft tree as Medusa-style paths of top-i indices; depth d holds the ranked tokens of
            the d-th of the k + 1 distributions. Defaults to `default_parallel_choices(num_mask_tokens)`.
    """

    model_type = "parallel_drafter"
    choices_field = "parallel_choices"

    def __init__(
        self,
        decoder_config: dict | None = None,
        hidden_size: int = 576,
        vocab_size: int = 49152,
        num_mask_tokens: int = 4,
        num_layers: int = 1,
        use_target_hidden_states: bool = False,
        init_layer: int | None = None,
        parallel_choices: list[list[int]] | None = None,
        **kwargs,
    ):
        if num_mask_tokens < 1 or num_layers < 1:
            raise ValueError(
                f"ParallelDrafterConfig needs num_mask_tokens >= 1 and num_layers >= 1, got {num_mask_tokens}, {num_layers}"
            )
        if decoder_config is None:
            decoder_config = LlamaConfig(
                hidden_size=hidden_size,
                intermediate_size=4 * hidden_size,
                num_attention_heads=max(1, hidden_size // 64),
            ).to_dict()
        if isinstance(decoder_config, PretrainedConfig):
            decoder_config = decoder_config.to_dict()
        decoder_config = dict(decoder_config)
        if "model_type" not in decoder_config:
            raise ValueError("decoder_config needs a 'model_type' (the target architecture's config as a dict)")
        if decoder_config.get("hidden_size", hidden_size) != hidden_size:
            raise ValueError(
                f"decoder_config.hidden_size={decoder_config['hidden_size']} but hidden_size={hidden_size}"
            )
        for key in ("architectures", "_name_or_path", "transformers_version", "auto_map", "dtype", "torch_dtype"):
            decoder_config.pop(key, None)
        self.decoder_config = decoder_config
        self.num_mask_tokens = num_mask_tokens
        self.num_layers = num_layers
        self.use_target_hidden_states = use_target_hidden_states
        self.init_layer = init_layer
        if parallel_choices is None:
            parallel_choices = default_parallel_choices(num_mask_tokens)
        self._set_choices(
            parallel_choices,
            num_mask_tokens + 1,
            f"{num_mask_tokens} mask tokens fill at most {num_mask_tokens + 1} levels",
        )
        super().__init__(hidden_size=hidden_size, vocab_size=vocab_size, **kwargs)

    def decoder(self) -> PretrainedConfig:
        """The config of the drafter's decoder stack: the target's, with ``num_layers`` layers, no embedding
        table of its own (a 1-row placeholder that the model drops) and sdpa attention (takes tree masks)."""
        cfg = dict(self.decoder_config)
        model_type = cfg.pop("model_type")
        cfg.update(
            num_hidden_layers=self.num_layers,
            vocab_size=1,
            pad_token_id=None,
            tie_word_embeddings=False,
            use_cache=True,
        )
        if cfg.get("layer_types"):
            cfg["layer_types"] = list(cfg["layer_types"])[-self.num_layers :]
        for key in ("bos_token_id", "eos_token_id"):
            cfg[key] = None
        config = AutoConfig.for_model(model_type, **cfg)
        config._attn_implementation = "sdpa"
        return config
