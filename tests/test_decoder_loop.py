"""The engine's decoder loop (`hf_speculative.engine.decoder_loop`): bitwise the model's forward, used only where it
is, and the model's own forward everywhere else."""

import pytest
import torch
from conftest import tiny_model
from test_batch import _window_cases
from transformers import DynamicCache

import hf_speculative as hfs
from hf_speculative._compat import cache_arg
from hf_speculative.engine import decoder_loop
from hf_speculative.engine.decoder_loop import DecoderLoop
from hf_speculative.engine.policy import SpeedPolicy


@pytest.fixture
def loop_calls(monkeypatch):
    calls = []
    run = DecoderLoop.__call__

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("attention_mask") is not None)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(DecoderLoop, "__call__", spy)
    return calls


def _drafters():
    return [hfs.PromptLookupDrafter(), hfs.HybridDrafter([hfs.PromptLookupDrafter(), hfs.TokenRecyclingDrafter()])]


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_an_enabled_model_verifies_through_the_loop_and_decodes_plain_generates_tokens(arch, attention, loop_calls):
    model = hfs.enable(tiny_model(arch, seed=5, attn_implementation=attention))
    policy = model._hfs_policy
    assert policy.loop_report(model).startswith("the engine's decoder loop")
    loop_calls.clear()  # the check at enable ran the loop
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 5, 17, 33, 2]])
    expected = model.generate(prompt, max_new_tokens=20, do_sample=False)
    for drafter in _drafters():
        out = model.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False)
        assert torch.equal(out, expected), type(drafter).__name__
    assert loop_calls and any(loop_calls)  # one-token steps and tree steps (with their 4D masks) both ran it


def test_a_batch_through_the_loop_decodes_plain_batched_generates_tokens(loop_calls):
    model = hfs.enable(tiny_model("llama", seed=6))
    prompts = torch.tensor([[0, 0, 5, 17, 33, 5, 17], [4, 8, 15, 16, 23, 42, 4]])
    mask = (prompts != 0).long()
    expected = model.generate(prompts, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    loop_calls.clear()
    out = model.generate(
        prompts,
        attention_mask=mask,
        assistant_model=hfs.PromptLookupDrafter(),
        max_new_tokens=16,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(out, expected) and loop_calls


WINDOWS = {"llama": dict(arch="llama"), **_window_cases()}  # windows of 8: Mistral, Qwen2, Qwen2 alternating


@pytest.mark.parametrize("case", sorted(WINDOWS))
def test_the_loops_hidden_states_are_the_models_bitwise(case):
    """Past a sliding window too: each layer gets the mask of its kind and its window, as the model's forward."""
    settings = dict(WINDOWS[case])
    model = tiny_model(settings.pop("arch"), seed=7, **settings)
    loop = DecoderLoop.for_model(model)
    ids = torch.randint(0, 96, (2, 10))
    positions = torch.arange(10)[None].expand(2, -1)
    with torch.no_grad():
        reference = model(
            input_ids=ids,
            position_ids=positions,
            **cache_arg(DynamicCache(config=model.config)),
            use_cache=True,
            output_hidden_states=True,
        )
        mine = loop(ids, positions, DynamicCache(config=model.config), output_hidden_states=True, logits_to_keep=2)
    assert len(mine.hidden_states) == len(reference.hidden_states) == model.config.num_hidden_layers + 1
    assert all(torch.equal(a, b) for a, b in zip(mine.hidden_states, reference.hidden_states))
    assert torch.equal(mine.final_state, reference.hidden_states[-1])
    assert torch.equal(mine.logits, reference.logits[:, -2:])


def test_the_models_own_forward_runs_when_the_loop_is_off_hooked_or_not_the_models(loop_calls, monkeypatch):
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 5, 17, 33]])
    generate = dict(assistant_model=hfs.PromptLookupDrafter(), max_new_tokens=12, do_sample=False)

    off = hfs.enable(tiny_model("llama", seed=8), policy=SpeedPolicy(forward="model"))
    assert "forward='model'" in off._hfs_policy.loop_report(off)
    monkeypatch.setenv("HF_SPECULATIVE_FORWARD", "model")  # read at enable
    from_env = hfs.enable(tiny_model("llama", seed=8))
    monkeypatch.delenv("HF_SPECULATIVE_FORWARD")
    with monkeypatch.context() as patch:
        patch.delitem(decoder_loop.SUPPORTED, "Qwen2ForCausalLM")  # a model class the loop does not serve
        other = hfs.enable(tiny_model("qwen2", seed=8))
        assert other._hfs_policy.decoder_loop(other) is None
    loop_calls.clear()
    for model in (off, from_env, other):
        expected = model.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(model.generate(prompt, **generate), expected)
    assert not loop_calls

    hooked = hfs.enable(tiny_model("llama", seed=8))  # a hook on a decoder layer: the loop would skip it
    seen = []
    hooked.model.layers[1].register_forward_pre_hook(lambda module, args: seen.append(1))
    expected = hooked.generate(prompt, max_new_tokens=12, do_sample=False)
    seen.clear()
    loop_calls.clear()
    assert torch.equal(hooked.generate(prompt, **generate), expected)
    assert seen and not loop_calls
    with torch.enable_grad():
        assert hooked._hfs_policy.decoder_loop(hooked) is None


def test_a_loop_that_fails_its_check_is_never_used(loop_calls, monkeypatch):
    layer = DecoderLoop.layer
    monkeypatch.setattr(DecoderLoop, "layer", lambda self, *a: layer(self, *a) * (1 + 1e-6))
    model = hfs.enable(tiny_model("llama", seed=9))
    policy = model._hfs_policy
    assert "check failed" in policy.loop_report(model) and "logits" in policy.loop_report(model)
    loop_calls.clear()
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 5, 17, 33]])
    expected = model.generate(prompt, max_new_tokens=12, do_sample=False)
    out = model.generate(prompt, assistant_model=hfs.PromptLookupDrafter(), max_new_tokens=12, do_sample=False)
    assert torch.equal(out, expected) and not loop_calls


def test_a_subclass_with_a_forward_of_its_own_is_not_served():
    model = tiny_model("llama", seed=10)

    class Patched(type(model)):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    model.__class__ = Patched
    assert DecoderLoop.for_model(model) is None
    with pytest.raises(ValueError, match="forward must be"):
        SpeedPolicy(forward="fast")


@pytest.mark.parametrize("case", [c for c in sorted(WINDOWS) if c != "llama"])
def test_past_a_sliding_window_the_loop_decodes_plain_generates_tokens(case, loop_calls):
    """The engine's tree masks with the window applied (one mask, or one per layer type for a model with windowed and
    full layers) go through the loop as through the model's forward."""
    settings = dict(WINDOWS[case])
    model = hfs.enable(tiny_model(settings.pop("arch"), seed=11, **settings))
    assert model._hfs_policy.loop_report(model).startswith("the engine's decoder loop")
    prompt = torch.tensor([[5, 17, 33, 2, 9, 41, 7, 5, 17, 33, 2, 9]])  # longer than the window of 8
    expected = model.generate(prompt, max_new_tokens=24, do_sample=False)
    loop_calls.clear()
    out = model.generate(prompt, assistant_model=_drafters()[1], max_new_tokens=24, do_sample=False)
    assert torch.equal(out, expected) and any(loop_calls)


def test_a_window_shorter_than_the_checks_tokens_is_checked_as_the_engine_holds_its_cache():
    """The check's caches keep every key, as the engine's do (a sliding layer that dropped keys would not fit the
    check's tree step), so a window of 4 under the check's 9 tokens is checked and served."""
    windowed = {
        "mistral": dict(sliding_window=4),
        "qwen2": dict(use_sliding_window=True, sliding_window=4, max_window_layers=0),
    }
    for arch, settings in windowed.items():
        model = hfs.enable(tiny_model(arch, seed=12, **settings))
        assert model._hfs_policy.loop_report(model).startswith("the engine's decoder loop"), arch
