"""Configuration of Speculative Streaming (Bhendawade et al., "Speculative Streaming: Fast LLM Inference without
Auxiliary Models", 2024, https://arxiv.org/abs/2402.11131)."""

from __future__ import annotations

from transformers import LlamaConfig

from ...engine.trees import TreeSpec
from ..configuration_drafter import DrafterConfigMixin

__all__ = ["SpeculativeStreamingConfig", "default_stream_tree"]

LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


#: the values each choice of the config takes (the first is the default)
CHOICES = {
    "mode": ("lossless", "shared"),
    "stream_design": ("embeddings", "value_rotation"),
    "stream_embedding_init": ("random", "token_embeddings"),
}


def default_stream_tree(num_streams: int, top_k: int | list[int] = 2) -> list[list[int]]:
    """Sec. 3.1.2: the top-k tokens of stream n are the parents of the top-k tokens of stream n+1 (a
    Cartesian tree of depth ``num_streams``). ``top_k`` may differ per stream."""
    ks = [top_k] * num_streams if isinstance(top_k, int) else list(top_k)
    return TreeSpec.cartesian(ks[:num_streams]).to_list()


class SpeculativeStreamingConfig(DrafterConfigMixin, LlamaConfig):
    r"""A `LlamaConfig` plus the Speculative Streaming settings of a `LlamaForSpeculativeStreaming` and those of
    `DrafterConfigMixin` (``base_model_name_or_path``: ``"reference"`` means `hf_speculative.bench.load_reference_model`,
    SmolLM2-135M-Instruct; ``draft_vocab_size``: the streams draft on this many target ids, see
    `LlamaForSpeculativeStreaming.set_draft_vocab`).

    The top ``num_msa_layers`` (N_s) decoder layers become multi-stream attention (MSA) layers (Sec. 3.1.1):
    at layer ``N - N_s`` each position t gets ``num_streams`` (gamma) speculative streams
    ``S_tj = f_eta(M_t) + P_j``; stream j predicts the token ``j`` places after the one the main stream
    predicts (main: ``t + 1``, stream j: ``t + 1 + j``).

    Args:
        num_streams (`int`, defaults to 3): gamma, the number of speculative streams (the deepest tree).
        num_msa_layers (`int`, defaults to 4): N_s, the number of top layers run as MSA layers.
        mode (`str`, defaults to `"lossless"`):
            ``"lossless"``: the base model is frozen and the main stream never sees the streams, so it
            computes exactly what the base model computes (the streams are trained alone, alpha_0 = 0).
            ``"shared"``: in the MSA layers the main stream also attends to its own streams at t (Eq. 1), so
            main and streams run jointly in every forward, and the base is fine-tuned with LoRA through PEFT
            (alpha_0 = 1, alpha_j = 0.1, Sec. 3.1.4 / H.1). The cache still holds main-stream keys/values only.
        stream_init_rank (`int`, defaults to 0): eta, the rank of the stream-init adapter f_eta; 0 makes f the
            identity (the streams start as copies of the main stream plus their identifier embedding).
        adapter_rank (`int`, defaults to 8): rank of the LoRA-style adapters on the MSA layers' q/k/v/o
            projections, applied only to the stream rows (0: no adapters, only stream embeddings train).
        adapter_alpha (`float`, defaults to 16.0): LoRA scaling numerator (scale = alpha / rank).
        stream_embedding_init (`str`, defaults to `"random"`): how `from_base_model` starts P_j. ``"random"``:
            normal with std ``initializer_range``, about 0.1% of the norm of the residual stream entering layer
            N - N_s, so the streams start as copies of the main stream; ``"token_embeddings"``: the target's mean
            input token embedding (what a token not yet known looks like on average, as a mask token would), scaled
            to that norm (measured on a short probe), plus 1% noise per stream. Not the default: in 40 steps on
            generic chat (SmolLM2-135M) it started at stream losses near 80 against 11-13 and was still behind in
            loss and in expected tau at the end (docs/speculative_streaming.md).
        stream_design (`str`, defaults to `"embeddings"`): ``"embeddings"`` (identifier embeddings P_j,
            Sec. 3.1.1) or ``"value_rotation"`` (Appendix C.3, not implemented).
        pruning_layer (`int`, *optional*): parallel tree pruning (Sec. 3.1.3): the early exit reads the state
            after this many decoder layers (1 .. N - N_s: before the MSA layers; shared mode 1 .. N - N_s - 1);
            None: no pruning head.
        pruning_rank (`int`, defaults to 8): theta, rank of the early-exit adapter used by pruning.
        pruning_threshold (`float`, defaults to 0.0): prune nodes (and their subtrees) whose estimated transition
            probability from their parent is below this threshold; 0 turns pruning off. Greedy drafts only.
        lora_rank (`int`, defaults to 8): shared mode: rank of the PEFT LoRA adapters injected into the base.
        lora_alpha (`float`, defaults to 16.0): shared mode: LoRA scaling numerator (scale = alpha / rank).
        lora_target_modules (`list[str]`, *optional*): shared mode: the base's projections that get LoRA
            (default: q/k/v/o and gate/up/down of every layer).
        tree_top_k (`int` or `list[int]`, defaults to 2): top-k per stream of the default Cartesian tree.
        stream_tree (`list[list[int]]`, *optional*): the static draft tree as Medusa-style paths (overrides
            ``tree_top_k``; its depth must be at most ``num_streams``).
        cost_aware_tree (`bool`, defaults to `True`): with a calibration (``calibration["stream_top_i_accuracy"]``),
            the default tree is the one with the best expected tau per unit of cost on the target's measured
            cost curve (`hf_speculative.drafters.cost_aware`); `False` keeps ``stream_tree``.
    """

    model_type = "speculative_streaming"

    def __init__(
        self,
        num_streams: int = 3,
        num_msa_layers: int = 4,
        mode: str = "lossless",
        stream_init_rank: int = 0,
        adapter_rank: int = 8,
        adapter_alpha: float = 16.0,
        stream_design: str = "embeddings",
        stream_embedding_init: str = "random",
        pruning_layer: int | None = None,
        pruning_rank: int = 8,
        pruning_threshold: float = 0.0,
        lora_rank: int = 8,
        lora_alpha: float = 16.0,
        lora_target_modules: list[str] | None = None,
        tree_top_k: int | list[int] = 2,
        stream_tree: list[list[int]] | None = None,
        cost_aware_tree: bool = True,
        draft_vocab_size: int | None = None,
        base_model_name_or_path: str | None = None,
        base_architecture: str | None = None,
        training: dict | None = None,
        results: dict | None = None,
        **kwargs,
    ):
        for name, value in (
            ("mode", mode),
            ("stream_design", stream_design),
            ("stream_embedding_init", stream_embedding_init),
        ):
            if value not in CHOICES[name]:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, CHOICES[name]))}, got {value!r}")
        if num_streams < 1 or num_msa_layers < 1:
            raise ValueError("num_streams and num_msa_layers must be >= 1")
        # the streams (Sec. 3.1.1), their adapters, tree pruning (Sec. 3.1.3) and shared mode's LoRA (Sec. 3.1.4)
        self.num_streams, self.num_msa_layers, self.mode = num_streams, num_msa_layers, mode
        self.stream_design, self.stream_init_rank = stream_design, stream_init_rank
        self.stream_embedding_init = stream_embedding_init
        self.adapter_rank, self.adapter_alpha = adapter_rank, adapter_alpha
        self.pruning_layer, self.pruning_rank, self.pruning_threshold = pruning_layer, pruning_rank, pruning_threshold
        self.lora_rank, self.lora_alpha = lora_rank, lora_alpha
        self.lora_target_modules = (
            list(lora_target_modules) if lora_target_modules is not None else list(LORA_TARGET_MODULES)
        )
        self.tree_top_k, self.cost_aware_tree = tree_top_k, cost_aware_tree
        self.stream_tree = stream_tree if stream_tree is not None else default_stream_tree(num_streams, tree_top_k)
        self.base_architecture, self.training, self.results = base_architecture, training, results
        super().__init__(base_model_name_or_path=base_model_name_or_path, draft_vocab_size=draft_vocab_size, **kwargs)
        if self.num_msa_layers > self.num_hidden_layers:
            raise ValueError(
                f"num_msa_layers={num_msa_layers} exceeds the {self.num_hidden_layers} layers of the model"
            )
        self.validate_pruning()
        if self.tree.depth > num_streams:
            raise ValueError(f"stream_tree is {self.tree.depth} deep but there are only {num_streams} streams")

    def validate_pruning(self) -> None:
        # shared mode runs its MSA layers jointly (not as decoder-layer calls): the pruning happens as a plain layer starts
        last = self.first_msa_layer if self.mode == "lossless" else self.first_msa_layer - 1
        if self.pruning_layer is not None and not 1 <= self.pruning_layer <= last:
            raise ValueError(
                f"pruning_layer={self.pruning_layer} must be in 1..{last} (the early exit comes before the MSA layers"
                + (", and in shared mode before the last plain layer)" if self.mode != "lossless" else ")")
            )
        if self.pruning_threshold > 0 and self.pruning_layer is None:
            raise ValueError(
                "pruning_threshold > 0 needs a pruning_layer (the early exit that estimates transition probabilities)"
            )

    @property
    def tree(self) -> TreeSpec:
        return TreeSpec.from_choices(self.stream_tree)

    @property
    def first_msa_layer(self) -> int:
        """N - N_s: the index of the first MSA layer (where the streams start)."""
        return self.num_hidden_layers - self.num_msa_layers
