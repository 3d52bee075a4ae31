"""The transformers compatibility shim: the KV cache's keyword is the installed release's (``cache`` from 5.24,
``past_key_values`` before), the engine and the drafters pass it without deprecation warnings, and the project's
own forwards take either name."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from conftest import tiny_model
from packaging.version import Version
from transformers import DynamicCache

import hf_speculative as hfs
from hf_speculative._compat import CACHE_ARG, cache_arg, get_cache, model_kwargs_cache, takes_cache


def test_cache_keyword_is_the_installed_releases():
    renamed = Version(transformers.__version__).release >= (5, 24)
    assert CACHE_ARG == ("cache" if renamed else "past_key_values")
    assert cache_arg(None) == {CACHE_ARG: None}
    assert model_kwargs_cache({CACHE_ARG: "c", "attention_mask": None}) == "c"
    assert model_kwargs_cache({}) is None


def test_forward_takes_and_returns_the_cache_without_warnings():
    model = tiny_model("llama", seed=0)
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=model.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = model(ids, **cache_arg(cache), use_cache=True)
    assert get_cache(out) is cache and cache.get_seq_length() == 6
    assert get_cache(object()) is None


def test_speculative_generate_passes_no_deprecated_keyword():
    target = hfs.enable(tiny_model("llama", seed=0))
    draft = tiny_model("llama", seed=1)
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = target.generate(
            ids, assistant_model=draft, max_new_tokens=8, do_sample=False, return_dict_in_generate=True
        )
    plain = target.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(out.sequences, plain)
    assert get_cache(out).get_seq_length() == out.sequences.shape[1] - 1


def test_takes_cache_accepts_either_name():
    @takes_cache
    def forward(x, cache=None):
        return x, cache

    assert forward(1, cache="c") == (1, "c")
    assert forward(1, past_key_values="c") == (1, "c")
    assert forward(1, cache="c", past_key_values=None) == (1, "c")
    with pytest.raises(ValueError, match="both `cache` and `past_key_values`"):
        forward(1, cache="a", past_key_values="b")
