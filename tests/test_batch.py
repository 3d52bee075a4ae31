"""Batch > 1: each row of a left-padded batch equals plain batched `generate()` on the same batch (greedy, fp32),
for every drafter, with rows that stop at different times; per-row lossless sampling; sliding-window and
hybrid caches inside and past the window."""

from __future__ import annotations

import pytest
import torch
from conftest import noisy_copy, speed_policy_as_shipped, tiny_model
from transformers import DynamicCache, StaticCache, StoppingCriteria, StoppingCriteriaList

import hf_speculative as hfs
from hf_speculative._compat import cache_arg
from hf_speculative.engine.protocol import TreeDrafter


@pytest.fixture(scope="module", autouse=True)
def _policy_as_shipped():
    """This suite runs under the speed policy a user gets (`conftest.speed_policy_as_shipped`)."""
    with speed_policy_as_shipped():
        yield


PAD = 0
ROWS = [[5, 17, 33, 2, 9, 41, 7], [12, 3], [8, 8, 21, 60, 4], [70, 11, 19, 5]]  # ragged lengths 7, 2, 5, 4


def left_padded(rows=ROWS, repeat: int = 2):
    """Left-padded ids and attention mask; each prompt repeated so prompt lookup finds matches."""
    rows = [r * repeat for r in rows]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _perturb(module, scale=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return module


def _recycling():
    return hfs.TokenRecyclingDrafter(cost_curve=lambda n: 1.0)  # a fixed cost curve: nothing measured in a test


#: every drafter, built for a target ``model`` (the ragged-batch tests run each of them on Llama, Mistral and Qwen2)
DRAFTERS = {
    "draft_lm": lambda model: noisy_copy(model, 0.3),
    "prompt_lookup": lambda model: hfs.PromptLookupDrafter(min_ngram_size=1),
    "prompt_lookup_default": lambda model: hfs.PromptLookupDrafter(),
    "medusa": lambda model: _perturb(hfs.MedusaHeadsModel.from_base_model(model, num_heads=3)),
    "parallel": lambda model: _perturb(hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=2)),
    "streaming": lambda model: _perturb(
        hfs.LlamaForSpeculativeStreaming.from_base_model(model, num_streams=2, num_msa_layers=1)
    ),
    "eagle1": lambda model: _perturb(hfs.EagleDrafter.from_base_model(model, variant="eagle1")),
    "eagle3": lambda model: _perturb(hfs.EagleDrafter.from_base_model(model, variant="eagle3")),
    "spire": lambda model: _perturb(hfs.SpireDrafter.from_base_model(model, num_layers=2, sliding_window=8)),
    "magicdec": lambda model: hfs.MagicDecDrafter(model, sliding_window=8),
    "token_recycling": lambda model: _recycling(),
    "hybrid": lambda model: hfs.HybridDrafter(
        [
            hfs.PromptLookupDrafter(min_ngram_size=1),
            _recycling(),
            hfs.MedusaHeadsModel.from_base_model(model, num_heads=3),
        ],
        cost_curve=lambda n: 1.0,
    ),
}


def drafters_for(model, arch: str) -> dict:
    return {name: make(model) for name, make in DRAFTERS.items()}


def _streams(seed=3):
    ss = hfs.LlamaForSpeculativeStreaming.from_base_model(
        tiny_model("llama", seed=seed), num_streams=3, num_msa_layers=2
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ss.streams.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return ss


def _eos_mid_batch(model, ids, mask, new):
    """An EOS token that one row produces early and another late (or never): rows stop at different times."""
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=PAD)
    generated = plain[:, ids.shape[1] :]
    for token in generated[0, 2:6].tolist():
        firsts = [(row == token).nonzero() for row in generated]
        where = [int(f[0]) if len(f) else new for f in firsts]
        if token != PAD and len(set(where)) > 1:
            return token
    return int(generated[0, 3])


def _eos_at_first_token(model, ids, mask, new):
    """An EOS token that stops one row with the prefill's own token while the other rows go on."""
    first = model.generate(ids, attention_mask=mask, max_new_tokens=1, do_sample=False, pad_token_id=PAD)[
        :, -1
    ].tolist()
    for token in first:
        if token != PAD and first.count(token) == 1:
            return token
    raise AssertionError(f"every row starts with a token another row shares: {first}")


@pytest.mark.parametrize("name", sorted(DRAFTERS))
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_batched_greedy_equals_plain_batched_generate(arch, name):
    """Ragged rows, exact per row: without EOS, with an EOS one row reaches early (mid-batch), and with an EOS that
    stops one row with its very first token (it leaves the batch before the first tree step)."""
    model = hfs.enable(tiny_model(arch, seed=2))
    ids, mask = left_padded()
    new = 24
    drafter = DRAFTERS[name](model)
    cases = {
        "none": {},
        "mid_batch": {"eos_token_id": _eos_mid_batch(model, ids, mask, new)},
        "first_token": {"eos_token_id": _eos_at_first_token(model, ids, mask, new)},
    }
    for case, kwargs in cases.items():
        plain = model.generate(
            ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=PAD, **kwargs
        )
        out = model.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=PAD,
            return_dict_in_generate=True,
            **kwargs,
        )
        assert torch.equal(out.sequences, plain), (arch, name, case)
        stats = out.speculative_stats
        assert len(stats.rows) == ids.shape[0]
        produced_by_row = []
        for b, row in enumerate(stats.rows):
            real = plain[b, ids.shape[1] :]
            produced = real.shape[0]
            if kwargs and kwargs["eos_token_id"] in real.tolist():
                produced = real.tolist().index(kwargs["eos_token_id"]) + 1
            assert row.num_new_tokens == produced, (name, case, b)
            assert row.mean_accepted_length >= 1.0
            produced_by_row.append(produced)
        if case != "none":
            assert len(set(produced_by_row)) > 1, (arch, case)  # the rows really stop at different times
        if case == "first_token":
            assert 1 in produced_by_row and max(produced_by_row) > 1
        assert stats.mean_accepted_length >= 1.0


def test_mask_buffer_keeps_rows_before_its_first_step():
    """Rows that leave the batch at the prefill leave the (not yet sized) mask buffer nothing to select; the first
    tree step sizes it to the rows that remain."""
    from hf_speculative.engine.trees import BatchTreeMaskBuffer

    buffer = BatchTreeMaskBuffer(torch.float32, "cpu")
    buffer.select(torch.tensor([0, 2]))
    visible = torch.tensor([[False, True, True], [True, True, True]])
    block = torch.zeros(2, 2)
    mask = buffer(visible, block)
    assert mask.shape == (2, 1, 2, 5)
    assert (mask[0, 0, :, 0] == torch.finfo(torch.float32).min).all() and (mask[1, 0, :, :3] == 0).all()
    buffer.select(torch.tensor([1]))
    assert buffer(visible[1:], block).shape == (1, 1, 2, 5)


def test_eos_stops_rows_at_different_times_and_pads_them():
    model = hfs.enable(tiny_model("llama", seed=2))
    ids, mask = left_padded()
    eos = _eos_mid_batch(model, ids, mask, 24)
    plain = model.generate(
        ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=PAD, eos_token_id=eos
    )
    ends = [(row[ids.shape[1] :] == eos).nonzero() for row in plain]
    assert len({int(e[0]) if len(e) else -1 for e in ends}) > 1  # the rows really stop at different steps
    out = model.generate(
        ids,
        attention_mask=mask,
        assistant_model=noisy_copy(model, 0.3),
        max_new_tokens=24,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=eos,
    )
    assert torch.equal(out, plain)


class StopAfterToken(StoppingCriteria):
    """A custom per-row criterion (no ``eos_token_id``: plain generate keeps extending rows it stopped)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


@pytest.mark.parametrize("drafter_name", ["draft_lm", "prompt_lookup", "medusa"])
def test_stopping_criteria_per_row(drafter_name):
    model = hfs.enable(tiny_model("qwen2", seed=2))
    ids, mask = left_padded()
    token = _eos_mid_batch(model, ids, mask, 20)
    drafter = drafters_for(model, "qwen2")[drafter_name]
    for criteria in (StopAfterToken(token),):
        plain = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=PAD,
            stopping_criteria=StoppingCriteriaList([criteria]),
        )
        out = model.generate(
            ids,
            attention_mask=mask,
            assistant_model=drafter,
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=PAD,
            stopping_criteria=StoppingCriteriaList([criteria]),
        )
        assert torch.equal(out, plain)
    # max_length and a single new token
    for kwargs in ({"max_length": ids.shape[1] + 7}, {"max_new_tokens": 1}):
        plain = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=PAD, **kwargs)
        out = model.generate(
            ids, attention_mask=mask, assistant_model=drafter, do_sample=False, pad_token_id=PAD, **kwargs
        )
        assert torch.equal(out, plain)


def test_speculative_streaming_batched():
    ss = _streams()
    base = hfs.enable(tiny_model("llama", seed=3))
    ids, mask = left_padded()
    plain = base.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    out = ss.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    assert torch.equal(out, plain)


def test_batch_of_one_with_padding_and_identical_rows():
    model = hfs.enable(tiny_model("llama", seed=2))
    ids, mask = left_padded()
    drafter = noisy_copy(model, 0.3)
    for b in range(ids.shape[0]):
        single = model.generate(
            ids[b : b + 1], attention_mask=mask[b : b + 1], max_new_tokens=16, do_sample=False, pad_token_id=PAD
        )
        out = model.generate(
            ids[b : b + 1],
            attention_mask=mask[b : b + 1],
            assistant_model=drafter,
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=PAD,
        )
        assert torch.equal(out, single)
    same = ids[:1].repeat(3, 1)
    plain = model.generate(same, max_new_tokens=16, do_sample=False)
    assert torch.equal(model.generate(same, assistant_model=drafter, max_new_tokens=16, do_sample=False), plain)


def test_a_one_row_drafter_works_batched_through_the_engine_loop():
    """A drafter that implements only the one-row methods subclasses `OneRowDrafter` and the engine's adapter runs
    them per row; a `TreeDrafter` with only those methods is told, in words, what to implement."""

    class LastTokenDrafter(hfs.OneRowDrafter):
        default_tree = hfs.TreeSpec.chain(2)

        def begin(self, prompt_ids, target_outputs):
            self.seen = [prompt_ids.shape[1]]

        def propose(self, sequence, tree, options):
            self.seen.append(sequence.shape[1])
            root = sequence[0, -1]
            return hfs.DraftTree(tokens=torch.stack([root, root, root]), parents=(-1, 0, 1))

    model = hfs.enable(tiny_model("mistral", seed=2))
    ids, mask = left_padded()
    drafter = LastTokenDrafter()
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD)
    assert torch.equal(
        model.generate(
            ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=12, do_sample=False, pad_token_id=PAD
        ),
        plain,
    )

    class NotBatched(TreeDrafter):
        default_tree = hfs.TreeSpec.chain(2)
        propose = LastTokenDrafter.propose

    with pytest.raises(NotImplementedError, match="subclass OneRowDrafter"):
        model.generate(
            ids, attention_mask=mask, assistant_model=NotBatched(), max_new_tokens=4, do_sample=False, pad_token_id=PAD
        )


def test_output_scores_batched():
    model = hfs.enable(tiny_model("llama", seed=2))
    ids, mask = left_padded()
    kwargs = dict(
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=PAD,
        return_dict_in_generate=True,
        output_scores=True,
    )
    plain = model.generate(ids, **kwargs)
    out = model.generate(ids, assistant_model=noisy_copy(model, 0.3), **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    assert len(out.scores) == len(plain.scores)
    for mine, ref in zip(out.scores, plain.scores):
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- sliding windows and hybrid caches


def _window_cases():
    return {
        "mistral": dict(arch="mistral", sliding_window=8),
        "qwen2": dict(arch="qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0),
        # Gemma-2-like: sliding and full layers alternate
        "hybrid": dict(
            arch="qwen2",
            use_sliding_window=True,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
    }


@pytest.mark.parametrize("case", ["mistral", "qwen2", "hybrid"])
def test_sliding_window_exact_past_the_window(case):
    kw = dict(_window_cases()[case])
    arch = kw.pop("arch")
    model = hfs.enable(tiny_model(arch, seed=4, **kw))
    cache_types = {type(layer).__name__ for layer in DynamicCache(config=model.config).layers}
    assert "DynamicSlidingWindowLayer" in cache_types
    if case == "hybrid":
        assert cache_types == {"DynamicSlidingWindowLayer", "DynamicLayer"}
    ids, mask = left_padded()
    # the window really matters: without it the output differs
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=PAD)
    drafters = {
        "draft_lm": noisy_copy(model, 0.3),
        "prompt_lookup": hfs.PromptLookupDrafter(min_ngram_size=1),
        "medusa": _perturb(hfs.MedusaHeadsModel.from_base_model(model, num_heads=3)),
        "parallel": _perturb(hfs.ParallelDrafter.from_base_model(model, num_mask_tokens=2)),
        "magicdec": hfs.MagicDecDrafter(model, sliding_window=6, num_sink_tokens=2, positions="original"),
    }
    for name, drafter in drafters.items():
        out = model.generate(
            ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=40, do_sample=False, pad_token_id=PAD
        )
        assert torch.equal(out, plain), (case, name)
        # batch of one, no padding, and a user cache built without a config (it must not lose the window)
        single = model.generate(ids[:1], max_new_tokens=40, do_sample=False)
        out = model.generate(
            ids[:1], assistant_model=drafter, max_new_tokens=40, do_sample=False, **cache_arg(DynamicCache())
        )
        assert torch.equal(out, single), (case, name)


def test_window_changes_the_output():
    """Negative control for the sliding-window tests: the same weights without a window generate differently."""
    windowed = tiny_model("mistral", seed=4, sliding_window=8)
    full = tiny_model("mistral", seed=4, sliding_window=None)
    ids, mask = left_padded()
    a = windowed.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=PAD)
    b = full.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=PAD)
    assert not torch.equal(a, b)


def test_default_mistral_config_is_accepted():
    model = hfs.enable(tiny_model("mistral", seed=2, sliding_window=4096))
    assert model.config.sliding_window == 4096
    ids, mask = left_padded()
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD)
    out = model.generate(
        ids,
        attention_mask=mask,
        assistant_model=noisy_copy(model, 0.3),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=PAD,
    )
    assert torch.equal(out, plain)


def test_draft_model_with_a_window_past_the_window():
    """The draft LM's own cache must not crop by absolute length past its window."""
    model = hfs.enable(tiny_model("mistral", seed=4, sliding_window=8))
    draft = noisy_copy(model, 0.1)  # a windowed draft model
    prompt = torch.tensor([ROWS[0] * 2])
    plain = model.generate(prompt, max_new_tokens=40, do_sample=False)
    assert torch.equal(model.generate(prompt, assistant_model=draft, max_new_tokens=40, do_sample=False), plain)


def test_caches_that_cannot_work_are_named():
    model = hfs.enable(tiny_model("mistral", seed=2, sliding_window=8))
    prompt = torch.tensor([ROWS[0]])
    with pytest.raises(ValueError, match="StaticCache"):
        model.generate(
            prompt,
            assistant_model=hfs.PromptLookupDrafter(),
            max_new_tokens=4,
            **cache_arg(StaticCache(config=model.config, max_cache_len=64)),
        )
    # a sliding layer that already evicted tokens
    cache = DynamicCache(config=model.config)
    long_prompt = torch.tensor([ROWS[0] * 3])
    with torch.no_grad():
        model(long_prompt, **cache_arg(cache), use_cache=True)
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer"):
        model.generate(
            torch.cat([long_prompt, prompt], -1),
            assistant_model=hfs.PromptLookupDrafter(),
            max_new_tokens=4,
            **cache_arg(cache),
        )


# ----------------------------------------------------------------------------- sampling, per row


@pytest.mark.slow
def test_batched_sampling_is_lossless_per_row():
    from test_sampling import ALPHA, NEW, VOCAB, _exact_generate, chi_square_pvalue

    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=VOCAB, num_layers=2))
    draft = tiny_model("llama", seed=99, vocab_size=VOCAB, num_layers=1)
    rows = [[1, 5, 2], [3, 7]]
    ids = torch.tensor([rows[0], [PAD] + rows[1]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    kw = dict(temperature=0.7, top_k=4, top_p=1.0)
    exact = [_exact_generate(target, torch.tensor([r]), **kw) for r in rows]
    drafter = hfs.CausalLMDrafter(draft, draft_sampling="without_replacement")
    spec = hfs.TreeSpec.cartesian([2, 2])
    torch.manual_seed(2024)
    n, copies = 2000, 25  # samples per row; each call decodes the two rows 25 times over, interleaved (50 rows)
    counts = [{}, {}]
    for _ in range(n // copies):
        out = target.generate(
            ids.repeat(copies, 1),
            attention_mask=mask.repeat(copies, 1),
            assistant_model=drafter,
            speculative_tree=spec,
            do_sample=True,
            max_new_tokens=NEW,
            pad_token_id=PAD,
            **kw,
        )
        for b, row in enumerate(out[:, -NEW:].tolist()):
            counts[b % 2][tuple(row)] = counts[b % 2].get(tuple(row), 0) + 1
    for b in range(2):
        assert chi_square_pvalue(counts[b], exact[b], n) > ALPHA, b
    # the rows' distributions differ (a row mixed up with the other would fail)
    assert chi_square_pvalue(counts[1], exact[0], n) < ALPHA


def test_gemma2_hybrid_cache_past_the_window():
    """A real Gemma-2 (alternating sliding and full layers, logit soft-capping: the engine's lazy LM head is off)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=8,
        max_position_embeddings=256,
        initializer_range=0.3,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = hfs.enable(Gemma2ForCausalLM._from_config(config, attn_implementation="eager").eval())
    assert {type(layer).__name__ for layer in DynamicCache(config=model.config).layers} == {
        "DynamicSlidingWindowLayer",
        "DynamicLayer",
    }
    ids, mask = left_padded()
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=PAD)
    for drafter in (hfs.PromptLookupDrafter(min_ngram_size=1), noisy_copy(model, 0.3)):
        out = model.generate(
            ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=40, do_sample=False, pad_token_id=PAD
        )
        assert torch.equal(out, plain), type(drafter).__name__
