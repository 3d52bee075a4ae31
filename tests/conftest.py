"""Tiny random models built from configs (no network) shared by the engine tests."""

from __future__ import annotations

import contextlib
import copy
import os
import random
import socket
import tempfile

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import hf_speculative as hfs

# Tiny models: one intra-op thread is fastest, and avoids OpenMP spin contention with other processes.
torch.set_num_threads(1)
# Calibrated drafters keep their saved trees unless a test turns cost-aware trees on (with an injected cost curve):
# no timing enters a test's outcome and nothing is measured into the user's cache.
os.environ.setdefault("HF_SPECULATIVE_COST_AWARE", "0")
# Online step pricing decides from wall-clock timings: off unless a test asks for it (speculative_pricing=True), so
# that tree sizes and tau in a test never depend on how busy the machine is. The output is the same either way.
os.environ.setdefault("HF_SPECULATIVE_PRICING", "0")
# Everything the library caches (the native kernel it builds, kernel tables, cost curves) goes to a folder of this
# test session's own, never the user's ~/.cache; per process, so the kernel is built once per pytest worker.
os.environ["HF_SPECULATIVE_CACHE"] = tempfile.mkdtemp(prefix="hfs-test-cache-")


@contextlib.contextmanager
def speed_policy_as_shipped():
    """The speed policy a user gets (step pricing and cost-aware trees on; ``enable`` reads the environment): the
    greedy, batch and sampling exactness suites run under it (module-scoped, so models their fixtures enable get
    it). Their outputs may not depend on it; tests of tau or tree sizes run with it off (the default here)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_SPECULATIVE_PRICING", "1")
        patch.setenv("HF_SPECULATIVE_COST_AWARE", "1")
        yield


# Tolerance for float32 tensors that two computation orders reach through a model's layers (tree forward against
# per-branch forwards, batched against one by one, fused against naive kernels): the last bits depend on the CPU's
# BLAS kernels and thread count, so a bound tuned on one machine fails on another. Token ids stay exact.
FP32_LAYERS = dict(rtol=1e-4, atol=1e-4)

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"use_sliding_window": False}),
}


def tiny_config(arch: str = "llama", vocab_size: int = 96, num_layers: int = 4, **overrides):
    config_cls, _, extra = ARCHITECTURES[arch]
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        # a large init makes the logits peaked: argmax is never a near-tie and sampling is far from uniform
        initializer_range=0.3,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    kwargs.update(extra)
    kwargs.update(overrides)
    return config_cls(**kwargs)


def tiny_model(arch: str = "llama", seed: int = 0, attn_implementation: str = "sdpa", **overrides):
    torch.manual_seed(seed)
    _, model_cls, _ = ARCHITECTURES[arch]
    model = model_cls._from_config(tiny_config(arch, **overrides), attn_implementation=attn_implementation)
    return model.eval()


def noisy_copy(model, noise: float, seed: int = 1):
    """A draft close to the target (high but imperfect acceptance): the target's weights plus noise."""
    torch.manual_seed(seed)
    draft = (
        type(model)
        ._from_config(copy.deepcopy(model.config), attn_implementation=model.config._attn_implementation)
        .eval()
    )
    draft.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return draft


def random_tree(rng: random.Random, max_nodes: int = 20, max_depth: int = 5) -> hfs.TreeSpec:
    """A random valid tree: every node's parent and lower-ranked sibling are in the tree."""
    paths = {(0,)}
    target = rng.randint(1, max_nodes)
    while len(paths) < target:
        p = rng.choice(sorted(paths))
        if rng.random() < 0.5 and len(p) < max_depth:
            paths.add(p + (0,))
        else:
            paths.add(p[:-1] + (p[-1] + 1,))
    return hfs.TreeSpec.from_choices(sorted(paths))


@pytest.fixture(params=sorted(ARCHITECTURES))
def arch(request):
    return request.param


def tiny_chat_model(num_layers: int):
    """A tiny random Llama with a tiny chat tokenizer (bench and distillation tests)."""
    from hf_speculative.bench.tiny import tiny_chat_tokenizer, tiny_llama

    tok = tiny_chat_tokenizer()
    return tiny_llama(tokenizer=tok, num_layers=num_layers), tok


def saved_chat_model_and_data(folder, num_layers: int, conversations: int = 8):
    """A tiny chat model saved in ``folder/base`` and ``conversations`` chat records in ``folder/data.jsonl`` (the
    ``train`` commands' CLI tests); returns ``(model, tokenizer, base folder, data file)``."""
    import json

    model, tok = tiny_chat_model(num_layers)
    model.save_pretrained(folder / "base")
    tok.save_pretrained(folder / "base")
    with open(folder / "data.jsonl", "w") as f:
        for i in range(conversations):
            msgs = [
                {"role": "user", "content": f"count {i}"},
                {"role": "assistant", "content": "one two three four five six"},
            ]
            f.write(json.dumps({"id": str(i), "messages": msgs}) + "\n")
    return model, tok, folder / "base", folder / "data.jsonl"


@pytest.fixture
def no_network(monkeypatch):
    """No network and offline mode off: the Hub endpoint is a local port that nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(
        constants, "HF_HUB_OFFLINE", False
    )  # read from the environment when huggingface_hub was imported
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
