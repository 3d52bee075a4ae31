"""The verification forward: tree logits equal per-branch logits, and cache compaction equals a re-run."""

import random

import pytest
import torch
from conftest import FP32_LAYERS, random_tree, tiny_model
from transformers import DynamicCache

import hf_speculative as hfs
from hf_speculative._compat import cache_arg
from hf_speculative.engine.cache import keep_path
from hf_speculative.engine.trees import tree_attention_mask


def _tree_forward(model, prompt, tree_tokens, spec):
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt[:, :-1], **cache_arg(cache), use_cache=True)
    past = prompt.shape[1] - 1
    mask = tree_attention_mask(spec.ancestors, past, model.dtype, "cpu")
    out = model(
        input_ids=tree_tokens[None],
        attention_mask=mask,
        position_ids=(past + spec.depths)[None],
        **cache_arg(cache),
        use_cache=True,
    )
    return out.logits[0], cache, past


def _random_case(rng, max_nodes):
    """A random tree, a prompt, and random tree tokens whose root is the prompt's last token."""
    spec = random_tree(rng, max_nodes=max_nodes)
    prompt = torch.randint(0, 96, (1, rng.randint(2, 9)))
    tokens = torch.randint(0, 96, (spec.num_nodes + 1,))
    tokens[0] = prompt[0, -1]
    return spec, prompt, tokens, hfs.DraftTree.from_spec(spec, tokens)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_logits_equal_per_branch_logits(arch, attn):
    model = tiny_model(arch, seed=3, attn_implementation=attn)
    rng = random.Random(0)
    for _ in range(4):
        spec, prompt, tokens, draft = _random_case(rng, 16)
        logits, _, _ = _tree_forward(model, prompt, tokens, spec)
        for node in range(len(draft)):
            path = draft.path_to(node)[1:]
            seq = torch.cat([prompt, tokens[path][None]], dim=-1)
            ref = model(input_ids=seq).logits[0, -1]
            torch.testing.assert_close(logits[node], ref, **FP32_LAYERS)


def test_cache_after_compaction_equals_rerun(arch):
    model = tiny_model(arch, seed=4)
    rng = random.Random(1)
    for _ in range(6):
        spec, prompt, tokens, draft = _random_case(rng, 20)
        _, cache, past = _tree_forward(model, prompt, tokens, spec)
        leaf = rng.randrange(len(draft))
        path = draft.path_to(leaf)
        keep_path(cache, past, path)
        rerun = DynamicCache(config=model.config)
        model(input_ids=torch.cat([prompt[:, :-1], tokens[path][None]], dim=-1), **cache_arg(rerun), use_cache=True)
        assert cache.get_seq_length() == rerun.get_seq_length() == past + len(path)
        for mine, ref in zip(cache.layers, rerun.layers):
            torch.testing.assert_close(mine.keys, ref.keys, **FP32_LAYERS)
            torch.testing.assert_close(mine.values, ref.values, **FP32_LAYERS)


def test_lazy_logits_only_when_logits_are_the_plain_lm_head():
    """Models whose logits are not lm_head(h) (logit scaling, soft-capping) fall back to full logits, exactly."""
    from transformers import LlamaForCausalLM

    from hf_speculative.engine.logits import NodeLogits

    class ScaledLogits(LlamaForCausalLM):  # stands for Cohere's logit_scale / Gemma's soft-capping
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = torch.tanh(out.logits / 3.0) * 3.0
            return out

    plain = tiny_model("llama", seed=8)
    scaled = ScaledLogits._from_config(plain.config, attn_implementation="sdpa").eval()
    scaled.load_state_dict(plain.state_dict())
    prompt = torch.randint(0, 96, (1, 6))
    for model, lazy in ((plain, True), (scaled, False)):
        out = model(input_ids=prompt, output_hidden_states=True, logits_to_keep=1)
        assert (NodeLogits.lazy_head(model, out) is not None) == lazy
        hfs.enable(model)
        draft = hfs.layer_cut_draft(model, 2)
        expected = model.generate(prompt, max_new_tokens=20, do_sample=False)
        assert torch.equal(model.generate(prompt, assistant_model=draft, max_new_tokens=20, do_sample=False), expected)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_final_state_comes_from_one_hook_unless_the_drafter_reads_hidden_states(arch, monkeypatch):
    """With the lazy head and a drafter that reads no hidden states, verification forwards run without
    ``output_hidden_states`` (the decoder's output is hooked instead); a model whose decoder output is not the head's
    input keeps it; outputs are plain generate()'s either way. (The model's own forward: the engine's decoder loop
    returns its final state itself, `tests/test_decoder_loop.py`.)"""
    from hf_speculative.engine import decoding
    from hf_speculative.engine.logits import FinalState

    monkeypatch.setenv("HF_SPECULATIVE_FORWARD", "model")

    asked = []
    forward = decoding.verification_forward
    monkeypatch.setattr(
        decoding, "verification_forward", lambda *a, **kw: asked.append(kw["output_hidden_states"]) or forward(*a, **kw)
    )
    model = hfs.enable(tiny_model(arch, seed=3))
    prompt = torch.randint(0, 96, (1, 7))
    expected = model.generate(prompt, max_new_tokens=16, do_sample=False)
    out = model.generate(prompt, assistant_model=hfs.PromptLookupDrafter(), max_new_tokens=16, do_sample=False)
    assert torch.equal(out, expected) and asked and not any(asked)

    asked.clear()  # a drafter that reads the target's hidden states gets them all
    heads = hfs.MedusaHeadsModel.from_base_model(model, num_heads=2)
    assert torch.equal(model.generate(prompt, assistant_model=heads, max_new_tokens=16, do_sample=False), expected)
    assert asked and all(asked)

    asked.clear()  # the decoder's output is not what the head reads: every layer's states, as before
    monkeypatch.setattr(FinalState, "check", lambda self, outputs: False)
    out = model.generate(prompt, assistant_model=hfs.PromptLookupDrafter(), max_new_tokens=16, do_sample=False)
    assert torch.equal(out, expected) and asked and all(asked)


def test_the_final_state_check_refuses_a_decoder_output_the_head_does_not_read():
    from hf_speculative.engine.logits import FinalState

    model = tiny_model("llama", seed=4)
    prompt = torch.randint(0, 96, (1, 5))
    final = FinalState(model)
    assert final.decoder is model.model
    with final.capture():
        out = model(input_ids=prompt, output_hidden_states=True, logits_to_keep=1)
    assert final.check(out)
    out.hidden_states = (*out.hidden_states[:-1], out.hidden_states[-1] + 1.0)
    assert not final.check(out)
    assert not model.model._forward_hooks  # the hook lives only inside capture()


def test_the_final_state_keeps_only_its_own_threads_forwards():
    """Two generate() calls on one model in two threads run the same decoder and its hooks: a capture keeps the
    forwards of its own thread only."""
    import threading

    from hf_speculative.engine.logits import FinalState

    model = tiny_model("llama", seed=4)
    mine, theirs = torch.randint(0, 96, (1, 5)), torch.randint(0, 96, (1, 3))
    final = FinalState(model)
    with final.capture():
        other = threading.Thread(target=lambda: model(input_ids=theirs))
        other.start()
        other.join()
        assert final.state is None
        out = model(input_ids=mine, output_hidden_states=True, logits_to_keep=1)
    assert final.check(out)


def test_pruning_hooks_leave_another_threads_forward_alone():
    """A pruning drafter's hooks sit on the model's layers during its verification forward; a forward of the same
    model in another thread (a second generate() call) must run as if they were not there."""
    import threading

    from hf_speculative.engine.tree_forward import _Pruning

    class Refuses:
        def prune_batch(self, states, drafts):
            raise AssertionError("another thread's forward reached this call's pruning hook")

    model = tiny_model("llama", seed=6)
    ids = torch.randint(0, 96, (1, 4))
    expected = model(input_ids=ids).logits
    result = {}
    with _Pruning(model, Refuses(), [], None, 1, None):
        other = threading.Thread(target=lambda: result.setdefault("logits", model(input_ids=ids).logits))
        other.start()
        other.join()
    assert torch.equal(result["logits"], expected)


@pytest.mark.parametrize("cap", [3.0, 40.0])
def test_the_lazy_head_check_reads_the_largest_logits(cap):
    """The check recomputes a few vocabulary rows, the prefill's largest logits among them: a soft cap that bends
    only large logits (tanh(x / 40) * 40 moves a logit of 2 by 2e-3, of 0.1 by 2e-7) is found as the whole head's
    check finds it."""
    from transformers import LlamaForCausalLM

    from hf_speculative.engine.logits import NodeLogits

    class Capped(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = torch.tanh(out.logits / cap) * cap
            return out

    plain = tiny_model("llama", seed=9)
    capped = Capped._from_config(plain.config, attn_implementation="sdpa").eval()
    capped.load_state_dict(plain.state_dict())
    prompt = torch.randint(0, 96, (2, 6))
    out = capped(input_ids=prompt, output_hidden_states=True, logits_to_keep=1)
    assert out.logits.abs().max() > 2  # some logits large enough for the cap to bend them by more than the tolerance
    assert NodeLogits.lazy_head(capped, out) is None
    assert NodeLogits.lazy_head(plain, plain(input_ids=prompt, output_hidden_states=True, logits_to_keep=1)) is not None


def test_reserved_layer_holds_what_a_dynamic_layer_holds_and_appends_in_place():
    """`ReservedLayer` against `DynamicLayer` through what the engine does to a cache: a prefill, one-token and tree
    appends, crops, a path kept in place, rows leaving the batch; a step's append writes into the same buffer."""
    from transformers.cache_utils import DynamicLayer

    from hf_speculative.engine.cache import RESERVE_COLUMNS, ReservedLayer, keep_path, release_tree_cache

    g = torch.Generator().manual_seed(0)
    plain, reserved = DynamicCache(), DynamicCache()
    plain.layers, reserved.layers = [DynamicLayer()], [ReservedLayer()]

    def update(columns: int, rows: int = 3):
        k, v = torch.randn(rows, 2, columns, 4, generator=g), torch.randn(rows, 2, columns, 5, generator=g)
        out = [cache.update(k, v, 0) for cache in (plain, reserved)]
        for a, b in zip(*out):
            assert torch.equal(a, b)

    def same():
        a, b = plain.layers[0], reserved.layers[0]
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)

    update(7)
    buffer = reserved.layers[0].keys.data_ptr()
    for _ in range(RESERVE_COLUMNS):  # one-token steps within the reserve: no new buffer
        update(1)
    assert reserved.layers[0].keys.data_ptr() == buffer
    update(RESERVE_COLUMNS)  # past the reserve: a larger buffer holding every column
    same()
    update(5)  # a tree step of 5 nodes, then a path of 2 kept in place and the rest cropped
    for cache in (plain, reserved):
        keep_path(cache, cache.get_seq_length() - 5, [0, 3])
    same()
    update(1)
    for cache in (plain, reserved):
        cache.crop(-2)
        cache.batch_select_indices(torch.tensor([0, 2]))  # a row left the batch
    same()
    update(3, rows=2)
    same()
    release_tree_cache(reserved)
    assert type(reserved.layers[0]) is DynamicLayer and reserved.layers[0].keys.is_contiguous()
    same()
