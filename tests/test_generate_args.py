"""The usual generate() arguments keep working with a tree drafter, and bad input gets clear errors."""

import pytest
import torch
from conftest import FP32_LAYERS, noisy_copy, tiny_model
from transformers import (
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    StaticCache,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.cache_utils import DynamicLayer
from transformers.generation.streamers import BaseStreamer

import hf_speculative as hfs
from hf_speculative._compat import cache_arg, get_cache


@pytest.fixture(scope="module")
def pair():
    target = hfs.enable(tiny_model("llama", seed=5))
    return target, noisy_copy(target, noise=0.2)


PROMPT = torch.tensor([[3, 17, 42, 8, 9]])


def _same(target, draft, speculative_tree=None, **kwargs):
    expected = target.generate(PROMPT, do_sample=False, **kwargs)
    out = target.generate(PROMPT, assistant_model=draft, speculative_tree=speculative_tree, do_sample=False, **kwargs)
    assert torch.equal(out, expected)
    return out


def test_enable_is_idempotent_and_plain_generate_unchanged():
    model = tiny_model("llama", seed=5)
    before = model.generate(PROMPT, max_new_tokens=12, do_sample=False)
    cls = type(model)
    assert hfs.enable(model) is model and hfs.enable(model) is model
    assert type(model).__name__ == "Speculative" + cls.__name__ and isinstance(model, cls) and hfs.is_enabled(model)
    assert type(model).__mro__.count(hfs.SpeculativeGenerationMixin) == 1
    assert torch.equal(model.generate(PROMPT, max_new_tokens=12, do_sample=False), before)
    assert model.config.architectures in (None, [cls.__name__])
    other = hfs.enable(tiny_model("llama", seed=6))
    assert type(other) is type(model)  # one subclass per original class


def test_min_new_tokens_and_repetition_penalty(pair):
    target, draft = pair
    free = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    eos = int(free[0, PROMPT.shape[1] + 2])
    _same(target, draft, max_new_tokens=20, eos_token_id=eos, min_new_tokens=8)
    _same(target, draft, max_new_tokens=20, repetition_penalty=1.8, no_repeat_ngram_size=2)


def test_custom_logits_processor_and_stopping_criteria(pair):
    target, draft = pair

    class Ban(LogitsProcessor):
        def __call__(self, input_ids, scores):
            scores = scores.clone()
            scores[:, (input_ids[:, -1] + 1) % scores.shape[-1]] = -float("inf")
            return scores

    class StopAtLength(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= PROMPT.shape[1] + 11, dtype=torch.bool)

    out = _same(
        target,
        draft,
        max_new_tokens=30,
        logits_processor=LogitsProcessorList([Ban()]),
        stopping_criteria=StoppingCriteriaList([StopAtLength()]),
    )
    assert out.shape[1] == PROMPT.shape[1] + 11


def test_streamer_receives_tokens_in_order(pair):
    target, draft = pair

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    streamer = Collect()
    out = target.generate(PROMPT, assistant_model=draft, streamer=streamer, max_new_tokens=15, do_sample=False)
    assert streamer.chunks[0] == PROMPT[0].tolist()
    assert sum(streamer.chunks[1:], []) == out[0, PROMPT.shape[1] :].tolist()
    assert all(len(c) == 1 for c in streamer.chunks[1:]) and streamer.ended


def test_return_dict_scores_logits_and_cache(pair):
    target, draft = pair
    plain = target.generate(
        PROMPT, max_new_tokens=10, do_sample=False, return_dict_in_generate=True, output_scores=True, output_logits=True
    )
    out = target.generate(
        PROMPT,
        assistant_model=draft,
        max_new_tokens=10,
        do_sample=False,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    assert torch.equal(out.sequences, plain.sequences)
    assert len(out.scores) == len(plain.scores) == 10
    for mine, ref in zip(out.scores, plain.scores):
        torch.testing.assert_close(mine, ref, **FP32_LAYERS)
    for mine, ref in zip(out.logits, plain.logits):
        torch.testing.assert_close(mine, ref, **FP32_LAYERS)
    stats = out.speculative_stats
    assert sum(stats.accepted_lengths) == 10 and stats.accepted_lengths[0] == 1
    assert stats.mean_accepted_length == pytest.approx(10 / len(stats.accepted_lengths))
    assert get_cache(out).get_seq_length() == out.sequences.shape[1] - 1
    assert set(stats.timings) == {"draft", "target", "engine"}
    # the engine's in-place layers are swapped back: the cache returned holds plain, compact layers, equal to plain's
    for mine, ref in zip(get_cache(out).layers, get_cache(plain).layers):
        assert type(mine) is DynamicLayer and mine.keys.is_contiguous() and mine.values.is_contiguous()
        torch.testing.assert_close(mine.keys, ref.keys, **FP32_LAYERS)
        torch.testing.assert_close(mine.values, ref.values, **FP32_LAYERS)


def test_a_cache_passed_in_is_continued_and_returned_with_plain_layers(pair):
    target, draft = pair
    cache, plain_cache = DynamicCache(config=target.config), DynamicCache(config=target.config)
    first = target.generate(PROMPT, max_new_tokens=4, do_sample=False, **cache_arg(plain_cache))
    mine = target.generate(PROMPT, assistant_model=draft, max_new_tokens=4, do_sample=False, **cache_arg(cache))
    assert torch.equal(mine, first)
    assert {type(layer) for layer in cache.layers} == {DynamicLayer}
    # a second call continues from that cache (a multi-turn chat), exactly as plain decoding does
    follow = torch.cat([first, torch.tensor([[11, 12]])], dim=-1)
    expected = target.generate(follow, max_new_tokens=6, do_sample=False, **cache_arg(plain_cache))
    out = target.generate(follow, assistant_model=draft, max_new_tokens=6, do_sample=False, **cache_arg(cache))
    assert torch.equal(out, expected)
    assert {type(layer) for layer in cache.layers} == {DynamicLayer}


def test_left_padded_prompt_with_attention_mask(pair):
    target, draft = pair
    pad = 0
    ids = torch.cat([torch.full((1, 3), pad), PROMPT], dim=-1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(PROMPT)], dim=-1)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=pad)
    out = target.generate(
        ids, attention_mask=mask, assistant_model=draft, max_new_tokens=12, do_sample=False, pad_token_id=pad
    )
    assert torch.equal(out, expected)


def test_tree_drafter_instance_and_chain(pair):
    target, draft = pair
    drafter = hfs.CausalLMDrafter(draft, tree=hfs.TreeSpec.cartesian([2, 2]))
    _same(target, drafter, max_new_tokens=16)
    _same(target, draft, max_new_tokens=16, speculative_tree=hfs.TreeSpec.chain(3))


# ----------------------------------------------------------------------------- bad input


def test_vocabulary_mismatch(pair):
    target, _ = pair
    other = tiny_model("llama", seed=1, vocab_size=80)
    with pytest.raises(ValueError, match="vocabulary mismatch.*96.*80"):
        target.generate(PROMPT, assistant_model=other, max_new_tokens=4)


def test_beams_and_return_sequences_refused(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="num_return_sequences"):
        target.generate(PROMPT, assistant_model=draft, max_new_tokens=4, num_return_sequences=2, do_sample=True)
    with pytest.raises(ValueError, match="num_beams"):
        target.generate(PROMPT, assistant_model=draft, max_new_tokens=4, num_beams=2)


def test_static_cache_rejected(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="DynamicCache"):
        target.generate(PROMPT, assistant_model=draft, max_new_tokens=4, cache_implementation="static")
    cache = StaticCache(config=target.config, max_cache_len=64)
    with pytest.raises(ValueError, match="DynamicCache"):
        target.generate(PROMPT, assistant_model=draft, max_new_tokens=4, **cache_arg(cache))


def test_flash_attention_rejected(pair):
    target, draft = pair
    target.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="cannot take the arbitrary tree attention mask"):
            target.generate(PROMPT, assistant_model=draft, max_new_tokens=4)
    finally:
        target.config._attn_implementation = "sdpa"
    draft_fa = tiny_model("llama", seed=2)
    draft_fa.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="tree attention mask"):
        target.generate(PROMPT, assistant_model=draft_fa, max_new_tokens=4)


def test_tree_deeper_than_drafter_and_wrong_types(pair):
    target, draft = pair

    class Shallow(hfs.CausalLMDrafter):
        max_depth = 2

    with pytest.raises(ValueError, match="at most 2 levels"):
        target.generate(
            PROMPT, assistant_model=Shallow(draft), speculative_tree=hfs.TreeSpec.chain(3), max_new_tokens=4
        )
    with pytest.raises(TypeError, match="TreeSpec"):
        target.generate(PROMPT, assistant_model=draft, speculative_tree=[[0], [0, 0]], max_new_tokens=4)
    with pytest.raises(TypeError, match="assistant_model must be"):
        target.generate(PROMPT, assistant_model="not a model", max_new_tokens=4)
    with pytest.raises(ValueError, match="need an assistant_model"):
        target.generate(PROMPT, speculative_tree=hfs.TreeSpec.chain(2), max_new_tokens=4)
