"""``hf-speculative export``: a drafter folder in the layout a serving engine's loader expects.

    hf-speculative export model_cards/medusa-smollm2-135m-instruct --format vllm --output medusa-vllm
    vllm serve TARGET --speculative-config '{"method": "medusa", "model": "medusa-vllm", "num_speculative_tokens": 4}'
    hf-speculative export model_cards/eagle-smollm2-135m-instruct --format sglang --output eagle3-sglang
    python -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 \
        --speculative-draft-model-path eagle3-sglang
    hf-speculative export model_cards/eagle-smollm2-135m-instruct --format speculators --output eagle3-speculators
    vllm serve eagle3-speculators      # the verifier its config names, with this drafter

EAGLE-1/2/3 drafters (`EagleDrafter` folders, or public EAGLE checkpoints) -> the public EAGLE / EAGLE-3 layout of
vLLM's and SGLang's loaders (`hf_speculative.drafters.eagle.serving`); EAGLE-3 drafters -> the layout of
vllm-project/speculators (``--format speculators``: `hf_speculative.drafters.eagle.speculators`), which vLLM serves
with the verifier its config names. Medusa heads (ours, or FasterDecoding/Medusa's
layout) -> vLLM's Medusa layout; SGLang has no Medusa loader. A plain causal-LM drafter (two-model speculative
decoding) is written as it is for both (vLLM ``draft_model``, SGLang ``STANDALONE``). Speculative Streaming and
ParallelDrafter have no serving-engine counterpart.
"""

from __future__ import annotations

import sys

FORMATS = ("vllm", "sglang", "speculators")

NO_COUNTERPART = {
    "speculative_streaming": (
        "Speculative Streaming has no serving-engine counterpart: it changes the target's own forward (multi-stream "
        "attention in its top layers), which neither vLLM nor SGLang implements, so there is no layout to export to. "
        "Serve it with hf_speculative (ss.generate or base.generate(assistant_model=ss))."
    ),
    "parallel_drafter": (
        "ParallelDrafter (ParallelSpec) has no serving-engine counterpart: neither vLLM nor SGLang implements its "
        "[MASK]-token parallel drafting, so there is no layout to export to. Serve it with hf_speculative "
        "(model.generate(assistant_model=drafter))."
    ),
}
SPECULATORS_EAGLE3_ONLY = (
    "--format speculators writes EAGLE-3 drafters (vllm-project/speculators' eagle3 layout); {folder} is {what}"
)
SGLANG_NO_MEDUSA = (
    "SGLang has no Medusa loader: its speculative decoding loads EAGLE / EAGLE-3 drafters, plain draft models "
    "(STANDALONE) and n-gram lookup. Export Medusa heads with --format vllm."
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a drafter in a serving engine's layout (EAGLE for vLLM/SGLang, Medusa for vLLM, EAGLE-3 for "
        "vllm-project/speculators)",
    )
    p.add_argument(
        "folder",
        help="drafter folder (hf_speculative's EAGLE or Medusa, a public EAGLE checkpoint, FasterDecoding/Medusa heads)",
    )
    p.add_argument("--format", required=True, choices=FORMATS, help="the serving engine whose loader reads the output")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument(
        "--model",
        default=None,
        help="target model, for heads that share its lm_head (default: the base the "
        "drafter's config names; 'reference' for SmolLM2-135M-Instruct); --format speculators: the verifier, whose "
        "embeddings and architectures are then written too",
    )
    p.add_argument(
        "--speculative-tokens",
        type=int,
        default=None,
        help="--format speculators: tokens the greedy proposal drafts per step (vLLM's num_speculative_tokens; "
        "default: the drafter's tree depth)",
    )
    p.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"hf-speculative export: {message}", file=sys.stderr)
    return 2


def run(args) -> int:
    from pathlib import Path

    from ..drafters.eagle.configuration_eagle import EagleConfig
    from ..drafters.eagle.modeling_eagle import is_public_checkpoint
    from ..drafters.medusa.fasterdecoding import fasterdecoding_config

    folder = Path(args.folder)
    if not (folder / "config.json").is_file():
        return _fail(f"{folder} is not a drafter folder (no config.json)")
    if fasterdecoding_config(folder) is not None:
        model_type = "medusa_heads"
    else:
        import json

        config = json.loads((folder / "config.json").read_text())
        model_type = config.get("model_type")
        if model_type == EagleConfig.model_type or is_public_checkpoint(folder):
            return _export_eagle(folder, args)
        if args.format == "speculators":
            return _fail(
                SPECULATORS_EAGLE3_ONLY.format(folder=folder, what=f"not an EAGLE drafter (model_type {model_type!r})")
            )
        if (
            any(a.endswith("ForCausalLM") for a in config.get("architectures") or [])
            and model_type not in NO_COUNTERPART
        ):
            return _export_draft_model(folder, args)
    if args.format == "speculators":
        return _fail(
            SPECULATORS_EAGLE3_ONLY.format(folder=folder, what="Medusa heads (FasterDecoding/Medusa's layout)")
        )
    if model_type in NO_COUNTERPART:
        return _fail(NO_COUNTERPART[model_type])
    if model_type != "medusa_heads":
        return _fail(
            f"{folder} is not an EAGLE or Medusa drafter (model_type {model_type!r}): export writes EagleDrafter folders "
            "and public EAGLE checkpoints for vLLM and SGLang, Medusa heads for vLLM, and plain causal-LM drafters as they are"
        )
    if args.format == "sglang":
        return _fail(SGLANG_NO_MEDUSA)
    return _export_medusa_vllm(folder, args)


def _export_eagle(folder, args) -> int:
    from ..drafters.eagle.modeling_eagle import EagleDrafter
    from ..drafters.eagle.serving import save_for_server

    drafter = EagleDrafter.from_pretrained(folder)
    if args.format == "speculators":
        return _export_speculators(drafter, folder, args)
    try:
        out = save_for_server(drafter, args.output, args.format)
    except ValueError as err:
        return _fail(str(err))
    eagle3 = drafter.config.is_eagle3
    vocab = f", draft vocabulary {drafter.lm_head.out_features}" if eagle3 else ""
    print(
        f"wrote {out} ({args.format} {'EAGLE-3' if eagle3 else 'EAGLE-1/2'} drafter{vocab}); serve with:\n  {_serve_eagle(args.format, eagle3, out)}"
    )
    return 0


def _export_speculators(drafter, folder, args) -> int:
    """An EAGLE-3 drafter in vllm-project/speculators' layout; with ``--model`` the verifier is loaded to write its
    embeddings, name and architectures, else its name is the config's and its architectures its cached config's."""
    from ..drafters.eagle.speculators import save_for_speculators

    if not drafter.config.is_eagle3:
        return _fail(
            SPECULATORS_EAGLE3_ONLY.format(
                folder=folder,
                what=f"an {drafter.config.variant} drafter: export it with --format vllm or --format sglang",
            )
        )
    name = drafter.config.base_model_name_or_path
    if args.model:
        from ..drafters.streaming.modeling_speculative_streaming import load_base_model
        from ..model_card import REFERENCE_BASE_MODEL

        target = load_base_model(args.model)
        drafter.attach_base_model(target)
        name = name or (REFERENCE_BASE_MODEL if args.model == "reference" else args.model)
        verifier = {"name_or_path": name, "architectures": list(target.config.architectures or [])}
    else:
        verifier = {"name_or_path": name, "architectures": _cached_architectures(name)}
    try:
        out = save_for_speculators(drafter, args.output, args.speculative_tokens, verifier)
    except ValueError as err:
        return _fail(str(err))
    embeddings = "with" if args.model else "without (vLLM uses the verifier's)"
    print(
        f"wrote {out} (speculators EAGLE-3 drafter, draft vocabulary {drafter.lm_head.out_features}, verifier "
        f"{name}, {embeddings} the embeddings); serve with:\n  vllm serve {out}\nor beside a target:\n  "
        f"{_serve_eagle('vllm', True, out)}"
    )
    return 0


def _cached_architectures(name: str | None) -> list[str]:
    """The ``architectures`` of the model ``name``'s config when it is a local folder or in the Hub cache, else none
    (the verifier entry of a speculators config may leave them out)."""
    if not name:
        return []
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(name, local_files_only=True)
    except (OSError, ValueError):  # neither here nor cached: nothing is downloaded for a list of names
        return []
    return list(config.get("architectures") or [])


def _serve_eagle(fmt: str, eagle3: bool, out) -> str:
    """The command that serves an exported EAGLE drafter: vLLM's speculative-config method, SGLang's algorithm."""
    import json

    if fmt == "vllm":
        spec = {"method": "eagle3" if eagle3 else "eagle", "model": str(out), "num_speculative_tokens": 5}
        return f"vllm serve TARGET --speculative-config '{json.dumps(spec)}'"
    algorithm = "EAGLE3" if eagle3 else "EAGLE"
    return f"python -m sglang.launch_server --model-path TARGET --speculative-algorithm {algorithm} --speculative-draft-model-path {out}"


def _export_medusa_vllm(folder, args) -> int:
    from ..drafters.medusa.modeling_medusa import MedusaHeadsModel
    from ..drafters.medusa.serving import save_for_vllm

    heads = MedusaHeadsModel.from_pretrained(folder)
    if heads.config.share_lm_head:
        from ..drafters.streaming.modeling_speculative_streaming import load_base_model

        heads.attach_base_model(load_base_model(args.model or heads.config.base_model_name_or_path))
    out = save_for_vllm(heads, args.output)
    print(
        f"wrote {out} (vLLM Medusa: {heads.config.num_heads} heads, {heads.config.num_layers} residual block(s) each"
        f"{', the shared lm_head copied into every head' if heads.config.share_lm_head else ''})"
    )
    return 0


def _export_draft_model(folder, args) -> int:
    """A plain causal LM drafts as is in both engines (vLLM ``"method": "draft_model"``, SGLang ``STANDALONE``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(folder).save_pretrained(args.output)
    try:
        AutoTokenizer.from_pretrained(folder).save_pretrained(args.output)
    except (OSError, ValueError):  # a drafter folder without its own tokenizer: the engine uses the target's
        pass
    engine = (
        "--speculative-algorithm STANDALONE --speculative-draft-model-path"
        if args.format == "sglang"
        else "draft model"
    )
    print(f"wrote {args.output} (a plain causal LM drafter; {args.format}: {engine} {args.output})")
    return 0
