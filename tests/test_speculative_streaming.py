"""Speculative Streaming (LlamaForSpeculativeStreaming): lossless main stream, untouched KV cache, the MSA
attention pattern of Eqs. 1-2, drafting through the tree engine, training loss, save/load, sampling."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_LAYERS, tiny_model
from transformers import AutoConfig, AutoModel, DynamicCache

import hf_speculative as hfs
from hf_speculative._compat import cache_arg, get_cache
from hf_speculative.drafters.streaming import LlamaForSpeculativeStreaming, SpeculativeStreamingConfig
from hf_speculative.drafters.streaming.modeling_speculative_streaming import (
    causal_key_mask,
    main_stream_layer,
    msa_stream_layer,
)
from hf_speculative.drafters.streaming.training_speculative_streaming import (
    IGNORE_INDEX,
    StreamCollator,
    StreamSegmentDataset,
    stream_labels,
    stream_losses,
    streaming_loss,
    train_speculative_streaming,
)
from hf_speculative.training.trainer import HiddenStates


def _randomize(ss, scale: float = 0.3, seed: int = 0):
    """Random NON-ZERO stream parameters (the init has zero LoRA B matrices)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ss.streams.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g))
    return ss


def _ss(arch="llama", seed=0, num_streams=3, num_msa_layers=2, **kw):
    base = tiny_model(arch, seed=seed, **kw)
    return base, _randomize(
        LlamaForSpeculativeStreaming.from_base_model(base, num_streams=num_streams, num_msa_layers=num_msa_layers)
    )


# --------------------------------------------------------------------------- construction


def test_stream_embeddings_start_from_the_token_embeddings_at_the_residual_streams_scale():
    """P_j: the mean token embedding's direction at the median norm of the states entering layer N - N_s on the
    probe, distinct per stream; ``"random"`` keeps the normal start of std ``initializer_range``."""
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import PROBE_LENGTH

    base = tiny_model("llama", seed=1)
    ss = LlamaForSpeculativeStreaming.from_base_model(
        base, num_streams=3, num_msa_layers=1, stream_embedding_init="token_embeddings"
    )
    P = ss.streams.stream_embeddings.weight.detach()
    ids = (torch.arange(PROBE_LENGTH) * 7919 + 13) % base.config.vocab_size
    with torch.no_grad():
        states = base.model(input_ids=ids[None], output_hidden_states=True).hidden_states
    entry = states[base.config.num_hidden_layers - 1][0, 1:]
    scale = float(entry.norm(dim=-1).median())
    assert torch.allclose(P.norm(dim=-1), torch.full((3,), scale), rtol=0.05)
    mean = base.get_input_embeddings().weight.detach().mean(0)
    assert torch.all(F.cosine_similarity(P, mean[None], dim=-1) > 0.99)
    assert not torch.equal(P[0], P[1])
    randomly = LlamaForSpeculativeStreaming.from_base_model(base, num_streams=3)
    assert randomly.config.stream_embedding_init == "random"
    std = float(randomly.streams.stream_embeddings.weight.std())
    assert abs(std - randomly.config.initializer_range) < 0.3 * randomly.config.initializer_range
    with pytest.raises(ValueError, match="stream_embedding_init"):
        SpeculativeStreamingConfig(stream_embedding_init="zeros")


def test_the_train_command_offers_the_configs_choices():
    from hf_speculative.commands.train_streaming import CHOICE_ARGS
    from hf_speculative.drafters.streaming.configuration_speculative_streaming import CHOICES

    assert {name: choices for name, (choices, _) in CHOICE_ARGS.items()} == {k: CHOICES[k] for k in CHOICE_ARGS}
    assert SpeculativeStreamingConfig().mode == CHOICES["mode"][0]
    assert SpeculativeStreamingConfig().stream_embedding_init == CHOICES["stream_embedding_init"][0]


def test_wraps_the_base_without_copying_and_counts_extra_parameters(arch):
    base, ss = _ss(arch)
    assert ss.model is base.model and ss.lm_head is base.get_output_embeddings()
    names = [n for n, _ in ss.named_parameters()]
    assert names and all(n.startswith("streams.") for n in names)  # base weights are not ours (not saved, not trained)
    c = ss.config
    H, r = c.hidden_size, c.adapter_rank
    d = c.hidden_size // c.num_attention_heads
    q, kv, m = c.num_attention_heads * d, c.num_key_value_heads * d, c.intermediate_size
    per_layer = r * ((H + q) + 2 * (H + kv) + (q + H) + 2 * (H + m) + (m + H))
    assert ss.num_stream_parameters() == c.num_streams * H + c.num_msa_layers * per_layer
    assert isinstance(ss.config, SpeculativeStreamingConfig) and ss.config.base_architecture == arch
    assert hfs.is_enabled(ss) and isinstance(ss, hfs.SpeculativeGenerationMixin)


def test_main_stream_is_the_base_model_and_the_cache_stays_the_base_models(arch):
    base, ss = _ss(arch)
    ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(1))
    c_base, c_ss = DynamicCache(config=base.config), DynamicCache(config=base.config)
    with torch.no_grad():
        ref = base(ids, **cache_arg(c_base), use_cache=True)
        out = ss(ids, cache=c_ss, use_cache=True, output_streams=True)
        assert torch.equal(out.logits, ref.logits)
        # the streams (and the drafter's evaluation from the cache) never write keys/values
        ss.stream_logits(out.stream_inputs[:, -1:], c_ss)
    assert c_ss.get_seq_length() == c_base.get_seq_length() == 11
    for a, b in zip(c_base.layers, c_ss.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert out.stream_logits.shape == (1, 11, ss.config.num_streams, 96)


def test_training_path_main_stream_matches_the_base_layers(arch):
    """`main_stream_layer` (training from cached states) computes what the base decoder layers compute."""
    base, ss = _ss(arch, num_msa_layers=3)
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hs = base(ids, output_hidden_states=True).hidden_states
        first = ss.config.first_msa_layer
        h = hs[first]
        pos = torch.arange(9)[None].expand(2, -1)
        cos, sin = ss.model.rotary_emb(h, pos)
        mask = causal_key_mask(2, 9, h.dtype, h.device)[:, None]
        for i, layer in enumerate(ss.msa_layers):
            h, _, _ = main_stream_layer(layer, h, mask, cos, sin)
            if first + i + 1 < ss.config.num_hidden_layers:
                torch.testing.assert_close(h, hs[first + i + 1], **FP32_LAYERS)
        torch.testing.assert_close(ss.model.norm(h), hs[-1], **FP32_LAYERS)
        # the streams of the training path equal those of the model's forward
        out = ss(ids, output_streams=True)
        torch.testing.assert_close(
            ss.lm_head(ss.streams_from_hidden(out.stream_inputs)), out.stream_logits, **FP32_LAYERS
        )


# --------------------------------------------------------------------------- attention pattern (Eqs. 1-2)


def _naive_msa(layer, adapters, streams, keys, values, cos, sin):
    """Eq. 2 written out per (t, j): q from stream j at t; keys/values = main[0..t] ++ streams[t, 0..j]."""
    attn = layer.self_attn
    B, T, G, H = streams.shape
    d, rep = keys.shape[-1], attn.num_key_value_groups

    def proj(name, mod, x):
        return mod(x) + adapters[name](x)

    x = layer.input_layernorm(streams)
    q = proj("q_proj", attn.q_proj, x).view(B, T, G, -1, d)
    k = proj("k_proj", attn.k_proj, x).view(B, T, G, -1, d)
    v = proj("v_proj", attn.v_proj, x).view(B, T, G, -1, d)

    def rot(y, t):
        return y * cos[:, t, None, :] + torch.cat([-y[..., d // 2 :], y[..., : d // 2]], -1) * sin[:, t, None, :]

    out = torch.zeros(B, T, G, q.shape[3], d)
    for t in range(T):
        for j in range(G):
            qj = rot(q[:, t, j], t)  # (B, heads, d)
            kk = torch.cat(
                [keys[:, :, : t + 1], rot(k[:, t, : j + 1], t).transpose(1, 2)], dim=2
            )  # (B, kv, t+1+j+1, d)
            vv = torch.cat([values[:, :, : t + 1], v[:, t, : j + 1].transpose(1, 2)], dim=2)
            kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
            w = torch.softmax((qj[:, :, None, :] * kk).sum(-1) * attn.scaling, dim=-1)  # (B, heads, keys)
            out[:, t, j] = (w[..., None] * vv).sum(2)
    s = streams + proj("o_proj", attn.o_proj, out.reshape(B, T, G, -1))
    x = layer.post_attention_layernorm(s)
    gate, up = proj("gate_proj", layer.mlp.gate_proj, x), proj("up_proj", layer.mlp.up_proj, x)
    return s + proj("down_proj", layer.mlp.down_proj, layer.mlp.act_fn(gate) * up)


def test_msa_layer_matches_eq2_written_out_per_stream_and_position():
    base, ss = _ss("llama", num_streams=3, num_msa_layers=1)
    layer, adapters = ss.msa_layers[0], ss.streams.adapters[0]
    T = 5
    ids = torch.randint(0, 96, (1, T), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache(config=base.config)
    with torch.no_grad():
        out = ss(ids, cache=cache, use_cache=True)
        streams = ss.streams.init_streams(out.stream_inputs)
        cos, sin = ss.model.rotary_emb(streams, torch.arange(T)[None])
        kc = cache.layers[layer.self_attn.layer_idx]
        fast = msa_stream_layer(
            layer, adapters, streams, kc.keys, kc.values, causal_key_mask(1, T, streams.dtype, "cpu"), cos, sin
        )
        slow = _naive_msa(layer, adapters, streams, kc.keys, kc.values, cos, sin)
    torch.testing.assert_close(fast, slow, **FP32_LAYERS)


def test_stream_visibility_by_perturbation():
    """Stream j at t sees main tokens <= t and streams <= j at t; nothing later, no other position's streams."""
    base, ss = _ss("llama", num_streams=3, num_msa_layers=2)
    T = 8
    ids = torch.randint(0, 96, (1, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = ss(ids, output_streams=True).stream_logits[0]  # (T, G, V)
        # a later main token changes no stream at earlier positions, but does change the streams at its own
        ids2 = ids.clone()
        ids2[0, 5] = (ids2[0, 5] + 1) % 96
        pert = ss(ids2, output_streams=True).stream_logits[0]
        assert torch.equal(pert[:5], ref[:5]) and not torch.allclose(pert[5], ref[5])
        # perturbing P_2 (stream index 1) leaves stream 1 unchanged and changes streams 2 and 3
        ss.streams.stream_embeddings.weight[1] += 1.0
        pert = ss(ids, output_streams=True).stream_logits[0]
        ss.streams.stream_embeddings.weight[1] -= 1.0
        torch.testing.assert_close(pert[:, 0], ref[:, 0], **FP32_LAYERS)
        assert not torch.allclose(pert[:, 1], ref[:, 1]) and not torch.allclose(pert[:, 2], ref[:, 2])
        # a stream sees no other position's streams: each position alone, from a cache of its prefix, is the same
        for t in range(T):
            cache = DynamicCache(config=base.config)
            out = ss(ids[:, : t + 1], cache=cache, use_cache=True)
            alone = ss.stream_logits(out.stream_inputs[:, -1:], cache)[0, 0]
            torch.testing.assert_close(alone, ref[t], **FP32_LAYERS)
        # lossless (Eq. 1 without streams): the main stream is blind to the streams
        assert torch.equal(ss(ids).logits, base(ids).logits)


def test_tree_mask_rows_are_used_for_the_streams():
    """In a tree forward each node's streams see the cached prefix and the node's ancestors only."""
    base, ss = _ss("qwen2")
    prefix = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(5))
    spec = hfs.TreeSpec.cartesian([2, 2])
    tokens = torch.randint(0, 96, (spec.num_nodes + 1,), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        cache = DynamicCache(config=base.config)
        ss(prefix[:, :-1], cache=cache, use_cache=True)
        tokens[0] = prefix[0, -1]
        from hf_speculative.engine.trees import tree_attention_mask

        mask = tree_attention_mask(spec.ancestors, 5, torch.float32, "cpu")
        pos = (5 + spec.depths)[None]
        out = ss(tokens[None], attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, output_streams=True)
        draft = hfs.DraftTree.from_spec(spec, tokens)
        for node in range(len(tokens)):
            path = draft.path_to(node)
            seq = torch.cat([prefix[:, :-1], tokens[path][None]], dim=1)
            alone = ss(seq, output_streams=True).stream_logits[0, -1]
            torch.testing.assert_close(out.stream_logits[0, node], alone, **FP32_LAYERS)


# --------------------------------------------------------------------------- drafting through generate()


@pytest.mark.parametrize("num_msa_layers, num_streams", [(1, 2), (2, 3), (4, 3)])
def test_lossless_greedy_equality_with_random_streams(arch, num_msa_layers, num_streams):
    base, ss = _ss(arch, seed=7, num_streams=num_streams, num_msa_layers=num_msa_layers)
    for seed, (length, new) in enumerate([(3, 17), (12, 30)]):
        ids = torch.randint(0, 96, (1, length), generator=torch.Generator().manual_seed(seed))
        ref = base.generate(ids, max_new_tokens=new, do_sample=False)
        out = ss.generate(ids, max_new_tokens=new, do_sample=False, return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref)
        # the cache left behind is the base model's cache of the committed sequence (minus the last token)
        cache = DynamicCache(config=base.config)
        with torch.no_grad():
            base(out.sequences[:, :-1], **cache_arg(cache), use_cache=True)
        assert get_cache(out).get_seq_length() == cache.get_seq_length()
        for a, b in zip(get_cache(out).layers, cache.layers):
            torch.testing.assert_close(a.keys, b.keys, **FP32_LAYERS)
    tree = hfs.TreeSpec.chain(num_streams)  # a chain override works too
    ref = base.generate(ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(ss.generate(ids, max_new_tokens=20, do_sample=False, speculative_tree=tree), ref)


def test_drafter_fills_the_tree_from_the_streams_at_the_last_accepted_node():
    """Depth d of each step's tree holds stream d's ranked tokens at the last accepted node of the previous
    step, as computed by a full forward over the committed sequence (the fused form of the paper)."""
    base, ss = _ss("llama", seed=8, num_streams=2)
    spec = hfs.TreeSpec.cartesian([3, 2])
    drafts = []
    original = hfs.drafters.streaming.SpeculativeStreamingDrafter.propose

    def spy(self, sequence, tree, options):
        d = original(self, sequence, tree, options)
        drafts.append((sequence.clone(), d))
        return d

    hfs.drafters.streaming.SpeculativeStreamingDrafter.propose = spy
    try:
        ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(9))
        ss.generate(ids, max_new_tokens=12, do_sample=False, speculative_tree=spec)
    finally:
        hfs.drafters.streaming.SpeculativeStreamingDrafter.propose = original
    assert len(drafts) >= 2
    for sequence, draft in drafts:
        with torch.no_grad():
            streams = ss(sequence[:, :-1], output_streams=True).stream_logits[0, -1]  # the node before the root
        top = torch.topk(streams, 3, dim=-1).indices
        for node, path in enumerate(spec.paths, start=1):
            assert int(draft.tokens[node]) == int(top[len(path) - 1, path[-1]])
        assert int(draft.tokens[0]) == int(sequence[0, -1])


def test_trained_streams_are_accepted():
    """A few training steps on the model's own greedy text make the streams predict it (tau > 1.3)."""
    base, ss = _ss("llama", seed=10, num_streams=2, num_msa_layers=2)
    with torch.no_grad():
        for p in ss.streams.parameters():
            p.mul_(0.1)
    ids = torch.randint(0, 96, (1, 4), generator=torch.Generator().manual_seed(11))
    text = base.generate(ids, max_new_tokens=60, do_sample=False)[0]
    with torch.no_grad():
        h = ss(text[None]).stream_inputs[0].half()
    labels = text.clone()
    labels[:4] = IGNORE_INDEX
    states = HiddenStates(h, text, labels, torch.tensor([0, len(text)]), ["a"])
    train_speculative_streaming(
        ss, states, output_dir="/tmp/ss_test_trainer", max_steps=60, learning_rate=2e-2, batch_size=1, progress=False
    )
    out = ss.generate(
        ids, max_new_tokens=60, do_sample=False, return_dict_in_generate=True, speculative_tree=hfs.TreeSpec.chain(2)
    )
    assert torch.equal(out.sequences[0], text)
    assert out.speculative_stats.mean_accepted_length > 1.3


# --------------------------------------------------------------------------- training loss


def test_stream_labels_by_hand():
    labels = torch.tensor([IGNORE_INDEX, IGNORE_INDEX, 5, 6, 7, 8])
    got = stream_labels(labels, 2)
    # stream j at t predicts the token t + 1 + j
    want = torch.tensor([[5, 6], [6, 7], [7, 8], [8, -100], [-100, -100], [-100, -100]])
    assert torch.equal(got, want)


def test_training_loss_on_a_hand_computed_case():
    head = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    # one sequence of 2 positions, 2 streams; states (T=2, G=2, H=2)
    states = torch.tensor([[[1.0, 0.0], [0.0, 2.0]], [[0.0, 0.0], [3.0, 1.0]]])
    targets = torch.tensor([[0, 2], [IGNORE_INDEX, 1]])

    def ce(h, y):  # -log softmax(W h)[y], by hand
        z = [h[0], h[1], h[0] + h[1]]
        return -(z[y] - math.log(sum(math.exp(v) for v in z)))

    s1 = ce([1.0, 0.0], 0)  # stream 1: only position 0 is valid
    s2 = (ce([0.0, 2.0], 2) + ce([3.0, 1.0], 1)) / 2
    per = stream_losses(head, states, targets)
    torch.testing.assert_close(per, torch.tensor([s1, s2]))
    torch.testing.assert_close(streaming_loss(per, [1.0, 0.5]), torch.tensor(s1 + 0.5 * s2))
    torch.testing.assert_close(
        streaming_loss(per, [1.0, 0.5], main_loss=torch.tensor(2.0), alpha_0=0.1), torch.tensor(s1 + 0.5 * s2 + 0.2)
    )


def test_trainer_loss_equals_the_stream_loss_of_the_model():
    base, ss = _ss("mistral", num_streams=2)
    text = torch.randint(0, 96, (20,), generator=torch.Generator().manual_seed(12))
    labels = text.clone()
    labels[:3] = IGNORE_INDEX
    with torch.no_grad():
        out = ss(text[None], output_streams=True)
    states = HiddenStates(out.stream_inputs[0], text, labels, torch.tensor([0, 20]), ["a"])
    data = StreamSegmentDataset(states, 2, segment_length=8)
    assert [item[0].shape[0] for item in data.items] == [8, 8, 4]
    batch = StreamCollator()([data[0], data[1], data[2]])
    from hf_speculative.drafters.streaming.training_speculative_streaming import SpeculativeStreamingTrainer

    loss = SpeculativeStreamingTrainer.compute_loss(
        type("T", (), {"stream_weights": None, "record_parts": lambda *a: None})(), ss, batch
    )
    # the same from the full-sequence forward (segments keep true positions but only see their own segment,
    # so compare on the first segment, which sees the whole prefix)
    tg = stream_labels(labels, 2)
    assert torch.equal(batch["targets"][0], tg[:8])
    with torch.no_grad():
        logits = ss.lm_head(ss.streams_from_hidden(batch["hidden"], batch["position_ids"]))  # (3, 8, 2, V)
    torch.testing.assert_close(logits[0], out.stream_logits[0, :8], **FP32_LAYERS)
    want = sum(
        F.cross_entropy(
            logits[..., j, :][batch["targets"][..., j] != IGNORE_INDEX],
            batch["targets"][..., j][batch["targets"][..., j] != IGNORE_INDEX],
        )
        for j in range(2)
    )
    torch.testing.assert_close(loss, want, **FP32_LAYERS)


# --------------------------------------------------------------------------- hub


def test_save_load_round_trip(tmp_path):
    base, ss = _ss("llama", num_streams=2, num_msa_layers=2)
    ss.config.base_model_name_or_path = "some/base"
    ss.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "model.safetensors"))
    assert set(saved) == {n for n, _ in ss.named_parameters()}  # streams only, no base weights
    assert AutoConfig.from_pretrained(tmp_path).model_type == "speculative_streaming"
    for loaded in (
        LlamaForSpeculativeStreaming.from_pretrained(tmp_path, base_model=base),
        AutoModel.from_pretrained(tmp_path, base_model=base),
    ):
        assert type(loaded).__name__ == "LlamaForSpeculativeStreaming" and loaded.model is base.model
        assert (
            loaded.config.base_model_name_or_path == "some/base" and loaded.config.stream_tree == ss.config.stream_tree
        )
        for (n1, p1), (n2, p2) in zip(ss.named_parameters(), loaded.named_parameters()):
            assert n1 == n2 and torch.equal(p1, p2)
        ids = torch.tensor([[3, 1, 4, 1, 5]])
        a = ss.generate(ids, max_new_tokens=10, do_sample=False, return_dict_in_generate=True)
        b = loaded.generate(ids, max_new_tokens=10, do_sample=False, return_dict_in_generate=True)
        assert torch.equal(a.sequences, b.sequences)
        assert a.speculative_stats.accepted_lengths == b.speculative_stats.accepted_lengths


def test_draft_vocabulary_keeps_greedy_equality_and_round_trips(tmp_path):
    # FR-Spec on the streams: drafting projects onto 24 of the 96 ids; verification is unchanged, so greedy is exact
    base, ss = _ss("llama", seed=3, num_streams=3, num_msa_layers=2)
    ss.set_draft_vocab(torch.arange(0, 96, 4))
    with torch.no_grad():
        logits = ss.stream_head(torch.randn(2, 3, base.config.hidden_size))
    assert torch.isinf(logits[..., 1::4]).all() and torch.isfinite(logits[..., ::4]).all()
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(1))
    ref = base.generate(ids, max_new_tokens=24, do_sample=False)
    assert torch.equal(ss.generate(ids, max_new_tokens=24, do_sample=False), ref)
    ss.save_pretrained(tmp_path)
    loaded = LlamaForSpeculativeStreaming.from_pretrained(tmp_path, base_model=base)
    assert loaded.config.draft_vocab_size == 24 and torch.equal(loaded.draft_to_target, ss.draft_to_target)
    assert torch.equal(loaded.generate(ids, max_new_tokens=24, do_sample=False), ref)


def test_bad_input_is_refused():
    base = tiny_model("llama")
    with pytest.raises(ValueError, match="mode"):
        SpeculativeStreamingConfig(mode="fast")
    with pytest.raises(ValueError, match="num_msa_layers"):
        LlamaForSpeculativeStreaming.from_base_model(base, num_msa_layers=9)
    ss = LlamaForSpeculativeStreaming.from_base_model(base, num_streams=2)
    with pytest.raises(ValueError, match="deep"):
        ss.generate(torch.tensor([[1, 2]]), max_new_tokens=4, speculative_tree=hfs.TreeSpec.chain(3))
    other = tiny_model("llama", num_layers=3)
    with pytest.raises(ValueError, match="layers"):
        ss.attach_base_model(other)


# --------------------------------------------------------------------------- sampling [3.1.6]


@pytest.mark.slow
def test_sampling_is_exact_in_lossless_mode():
    """Chi-square goodness of fit of sampled continuations against the target's exact distribution."""
    from test_sampling import ALPHA, NEW, SETTINGS, VOCAB, _batched_sample_counts, _exact_generate, chi_square_pvalue

    target = tiny_model("llama", seed=21, vocab_size=VOCAB, num_layers=2)
    ss = _randomize(LlamaForSpeculativeStreaming.from_base_model(target, num_streams=2, num_msa_layers=1), 0.5, seed=3)
    kw = SETTINGS["temperature-0.7-top-k-4"]
    prompt = torch.tensor([[1, 5, 2]])
    exact = _exact_generate(target, prompt, **kw)
    tree = hfs.TreeSpec.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
    torch.manual_seed(2025)
    n = 2000
    gen = dict(
        do_sample=True, max_new_tokens=NEW, top_k=kw["top_k"], temperature=kw["temperature"], speculative_tree=tree
    )
    counts = _batched_sample_counts(lambda ids, mask: ss.generate(ids, attention_mask=mask, **gen), prompt, n)
    assert chi_square_pvalue(counts, exact, n) > ALPHA
    # the streams' proposal really differs from the target's distribution two tokens ahead
    with torch.no_grad():
        out = ss(prompt, output_streams=True)
        q = torch.softmax(out.stream_logits[0, -1, 0], -1)
        p = torch.softmax(target(torch.cat([prompt, out.logits[:, -1:].argmax(-1)], 1)).logits[0, -1], -1)
    assert 0.5 * (p - q).abs().sum() > 0.2


def test_cli_registers_train_streaming():
    from hf_speculative.cli import build_parser

    args = build_parser().parse_args(["train", "streaming", "--data", "x.jsonl", "--out", "o", "--num-streams", "2"])
    assert args.num_streams == 2 and args.num_msa_layers == 4


def test_streams_as_an_assistant_of_the_base_model():
    """``base.generate(assistant_model=ss)`` (how the bench runs a drafter folder) drafts the same trees as
    ``ss.generate``: the streams read the base's hidden states entering layer N - N_s."""
    base, ss = _ss("qwen2", seed=13)
    hfs.enable(base)
    with torch.no_grad():
        out = ss(torch.tensor([[4, 8, 15]]), output_hidden_states=True)
    assert torch.equal(out.hidden_states[ss.config.first_msa_layer], out.stream_inputs)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    a = ss.generate(ids, max_new_tokens=25, do_sample=False, return_dict_in_generate=True)
    b = base.generate(ids, max_new_tokens=25, do_sample=False, return_dict_in_generate=True, assistant_model=ss)
    assert torch.equal(a.sequences, b.sequences)
    assert a.speculative_stats.accepted_lengths == b.speculative_stats.accepted_lengths


# --------------------------------------------------------------------------- shared mode [3.1.1 Eq. 1, 3.1.4]


def _shared(arch="llama", seed=0, num_streams=3, num_msa_layers=2, scale=0.3, **kw):
    """A shared-mode model on a tiny base with random NON-ZERO streams and LoRA weights (PEFT inits B = 0)."""
    base = tiny_model(arch, seed=seed, **kw)
    ss = LlamaForSpeculativeStreaming.from_base_model(
        base, num_streams=num_streams, num_msa_layers=num_msa_layers, mode="shared", lora_rank=4
    )
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in ss.trainable_parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g))
    return base, ss


def test_shared_mode_injects_lora_and_trains_streams_and_lora():
    base, ss = _shared("llama")
    lora = [n for n, p in base.named_parameters() if p.requires_grad]
    assert lora and all("lora_" in n for n in lora)
    assert len(ss.trainable_parameters()) == len(list(ss.streams.parameters())) + len(lora)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    with torch.no_grad():
        out = ss(ids, output_streams=True)
    assert out.stream_states.shape == (1, 6, 3, 32) and out.stream_logits.shape == (1, 6, 3, 96)
    torch.testing.assert_close(out.stream_logits, ss.lm_head(out.stream_states))
    # the cache holds the main stream's keys/values only, one per position
    cache = DynamicCache(config=base.config)
    with torch.no_grad():
        ss(ids, cache=cache, use_cache=True)
    assert cache.get_seq_length() == 6 and all(layer.keys.shape[2] == 6 for layer in cache.layers)
    with pytest.raises(ValueError, match="drafts and verifies for itself"):
        hfs.enable(base).generate(ids, assistant_model=ss, max_new_tokens=3)


def test_shared_main_row_matches_eq1_written_out():
    """Eq. 1 by hand: the main row at t attends to main keys <= t and to ALL gamma streams at t (no stream
    adapters on the main row); the stream rows are Eq. 2 (`_naive_msa`) with the main keys of this layer."""
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import msa_layer

    base, ss = _shared("llama", num_streams=3, num_msa_layers=1, scale=0.1)
    layer, adapters = ss.msa_layers[0], ss.streams.adapters[0]
    attn = layer.self_attn
    T, G, H = 5, 3, 32
    g = torch.Generator().manual_seed(3)
    main, streams = torch.randn(1, T, H, generator=g), torch.randn(1, T, G, H, generator=g)
    pos = torch.arange(T)[None]
    cos, sin = ss.model.rotary_emb(main, pos)
    d, rep = attn.head_dim, attn.num_key_value_groups

    def rot(y, t):
        return y * cos[:, t, None, :] + torch.cat([-y[..., d // 2 :], y[..., : d // 2]], -1) * sin[:, t, None, :]

    with torch.no_grad():
        rows = torch.cat([main[:, :, None], streams], dim=2)
        fast = msa_layer(
            layer, adapters, rows, lambda k, v: (k, v), causal_key_mask(1, T, main.dtype, "cpu"), cos, sin, num_main=1
        )
        x = layer.input_layernorm(main)
        keys = torch.stack([rot(attn.k_proj(x).view(1, T, -1, d)[:, t], t) for t in range(T)], 2)  # (1, kv, T, d)
        values = attn.v_proj(x).view(1, T, -1, d).transpose(1, 2)
        xs = layer.input_layernorm(streams)
        ks = (attn.k_proj(xs) + adapters["k_proj"](xs)).view(1, T, G, -1, d)
        vs = (attn.v_proj(xs) + adapters["v_proj"](xs)).view(1, T, G, -1, d)
        q = attn.q_proj(x).view(1, T, -1, d)
        out = torch.zeros(1, T, q.shape[2], d)
        for t in range(T):
            kk = torch.cat([keys[:, :, : t + 1], rot(ks[:, t], t).transpose(1, 2)], 2).repeat_interleave(rep, 1)
            vv = torch.cat([values[:, :, : t + 1], vs[:, t].transpose(1, 2)], 2).repeat_interleave(rep, 1)
            w = torch.softmax((rot(q[:, t], t)[:, :, None, :] * kk).sum(-1) * attn.scaling, -1)
            out[:, t] = (w[..., None] * vv).sum(2)
        m = main + attn.o_proj(out.reshape(1, T, -1))
        m = m + layer.mlp(layer.post_attention_layernorm(m))
        slow_streams = _naive_msa(layer, adapters, streams, keys, values, cos, sin)
    torch.testing.assert_close(fast[:, :, 0], m, **FP32_LAYERS)
    torch.testing.assert_close(fast[:, :, 1:], slow_streams, **FP32_LAYERS)


def test_shared_main_stream_sees_its_own_streams_only(arch):
    """Perturbing the streams at position s changes the main stream at s (Eq. 1) and, with one MSA layer, at no
    other position; with two MSA layers positions before s are untouched (causal). Lossless: never."""
    from hf_speculative.drafters.streaming.modeling_speculative_streaming import SpeculativeStreams

    ids = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(4))
    s = 5
    original = SpeculativeStreams.init_streams

    def perturbed(self, main_hidden):
        out = original(self, main_hidden).clone()
        out[:, s] += 1.0
        return out

    for n_s, mode in [(1, "shared"), (2, "shared"), (1, "lossless")]:
        _, ss = _shared(arch, num_msa_layers=n_s) if mode == "shared" else _ss(arch, num_msa_layers=n_s)
        with torch.no_grad():
            ref = ss(ids).logits[0]
            SpeculativeStreams.init_streams = perturbed
            try:
                pert = ss(ids).logits[0]
            finally:
                SpeculativeStreams.init_streams = original
        if mode == "lossless":
            assert torch.equal(pert, ref)
            continue
        assert not torch.allclose(pert[s], ref[s])
        assert torch.equal(pert[:s], ref[:s])
        if n_s == 1:
            assert torch.equal(pert[s + 1 :], ref[s + 1 :])


def test_shared_tree_forward_matches_path_forwards():
    """A tree-verification forward (4D tree mask, per-node positions) gives each node the main logits, stream
    states and cache entries of a plain forward over its path."""
    base, ss = _shared("qwen2")
    prefix = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(5))
    spec = hfs.TreeSpec.cartesian([2, 2])
    tokens = torch.randint(0, 96, (spec.num_nodes + 1,), generator=torch.Generator().manual_seed(6))
    tokens[0] = prefix[0, -1]
    from hf_speculative.engine.trees import tree_attention_mask

    with torch.no_grad():
        cache = DynamicCache(config=base.config)
        ss(prefix[:, :-1], cache=cache, use_cache=True)
        mask = tree_attention_mask(spec.ancestors, 5, torch.float32, "cpu")
        out = ss(tokens[None], attention_mask=mask, position_ids=(5 + spec.depths)[None], cache=cache, use_cache=True)
        draft = hfs.DraftTree.from_spec(spec, tokens)
        for node in range(len(tokens)):
            seq = torch.cat([prefix[:, :-1], tokens[draft.path_to(node)][None]], dim=1)
            alone = ss(seq)
            torch.testing.assert_close(out.logits[0, node], alone.logits[0, -1], **FP32_LAYERS)
            torch.testing.assert_close(out.stream_states[0, node], alone.stream_states[0, -1], **FP32_LAYERS)


@pytest.mark.parametrize("num_msa_layers, num_streams", [(1, 2), (2, 3), (4, 3)])
def test_shared_greedy_equals_its_own_autoregressive_decoding(arch, num_msa_layers, num_streams):
    """Shared mode is a changed model: speculative greedy output equals the same model's plain greedy decoding
    (`generate_autoregressive`: transformers' loop over the same joint forward), token for token."""
    _, ss = _shared(arch, seed=7, num_streams=num_streams, num_msa_layers=num_msa_layers)
    prompts = [torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(n)) for n in (3, 12)]
    for ids, new, tree in itertools.product(prompts, (17, 30), (None, hfs.TreeSpec.chain(num_streams))):
        want = ss.generate_autoregressive(ids, max_new_tokens=new, do_sample=False)
        got = ss.generate(ids, max_new_tokens=new, do_sample=False, speculative_tree=tree, return_dict_in_generate=True)
        assert torch.equal(got.sequences, want), (ids, new, tree)
    # the cache left behind is the joint forward's (main-stream only) cache of the committed sequence
    expected = DynamicCache(config=ss.base.config)
    with torch.no_grad():
        ss(got.sequences[:, :-1], cache=expected, use_cache=True)
    assert get_cache(got).get_seq_length() == expected.get_seq_length() == got.sequences.shape[1] - 1
    for mine, theirs in zip(get_cache(got).layers, expected.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-3, atol=3e-4)  # float noise of other shapes
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-3, atol=3e-4)


def test_shared_drafter_takes_the_streams_of_the_verification_forward():
    """Depth d of each tree holds stream d's top tokens at the last accepted node, as the joint forward over the
    committed sequence computes them."""
    _, ss = _shared("llama", seed=8, num_streams=2)
    spec = hfs.TreeSpec.cartesian([3, 2])
    drafts = []

    class Recording(hfs.drafters.streaming.SpeculativeStreamingDrafter):
        def propose(self, sequence, tree, options):
            drafts.append((sequence.clone(), super().propose(sequence, tree, options)))
            return drafts[-1][1]

    ss.get_self_drafter = lambda: Recording(ss)
    ss.generate(torch.tensor([[5, 7, 11, 2, 9]]), max_new_tokens=12, do_sample=False, speculative_tree=spec)
    assert len(drafts) >= 2
    for sequence, draft in drafts:
        with torch.no_grad():
            top = torch.topk(ss(sequence[:, :-1], output_streams=True).stream_logits[0, -1], 3, dim=-1).indices
        for node, path in enumerate(spec.paths, start=1):
            assert int(draft.tokens[node]) == int(top[len(path) - 1, path[-1]])


def _token_batch(ss, text, prompt_len):
    from hf_speculative.training.trainer import HiddenStates as States

    labels = text.clone()
    labels[:prompt_len] = IGNORE_INDEX
    states = States(torch.empty(0), text, labels, torch.tensor([0, len(text)]), ["a"])
    data = StreamSegmentDataset(states, ss.config.num_streams, segment_length=256, shared=True)
    return states, StreamCollator()([data[0]])


def test_shared_training_loss_on_a_hand_computed_case():
    """L = 1 * CE(main_t, y_t+1) + sum_j 0.1 * CE(stream_tj, y_t+1+j) over answer tokens, against the model's
    own logits computed independently (plain forward, per-position cross entropies)."""
    from hf_speculative.drafters.streaming.training_speculative_streaming import SpeculativeStreamingTrainer

    _, ss = _shared("mistral", num_streams=2)
    text = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(12))
    _, batch = _token_batch(ss, text, prompt_len=4)
    no = torch.full((3,), IGNORE_INDEX)
    assert torch.equal(batch["targets"][0, :, 0], torch.cat([no, text[4:], no[:1]]))  # next token, answer tokens 4..11
    fake = type("T", (), {"stream_weights": None, "alpha_0": 1.0, "record_parts": lambda *a: None})()
    loss = SpeculativeStreamingTrainer.compute_loss(fake, ss, batch)
    with torch.no_grad():
        out = ss(text[None], output_streams=True)
    main = F.log_softmax(out.logits[0], -1)
    streams = F.log_softmax(out.stream_logits[0], -1)
    ce_main = -sum(main[t, text[t + 1]] for t in range(3, 11)) / 8  # targets text[4..11]
    ce = [-sum(streams[t, j - 1, text[t + 1 + j]] for t in range(3 - j, 11 - j)) / 8 for j in (1, 2)]
    torch.testing.assert_close(loss, ce_main + 0.1 * (ce[0] + ce[1]), **FP32_LAYERS)


def test_shared_training_lowers_the_loss_and_keeps_greedy_equality():
    """A few steps of shared-mode training (streams + LoRA through the Trainer) lower the loss on the model's
    own text (main and streams); speculative greedy output still equals the trained model's own autoregressive
    decoding, with drafted tokens accepted."""
    from hf_speculative.drafters.streaming.training_speculative_streaming import SpeculativeStreamingTrainer

    _, ss = _shared("llama", seed=10, num_streams=2, scale=0.03)
    ids = torch.randint(0, 96, (1, 4), generator=torch.Generator().manual_seed(11))
    text = ss.generate_autoregressive(ids, max_new_tokens=40, do_sample=False)[0]
    states, batch = _token_batch(ss, text, prompt_len=4)
    fake = type("T", (), {"stream_weights": None, "alpha_0": 1.0, "record_parts": lambda *a: None})()
    with torch.no_grad():
        before = float(SpeculativeStreamingTrainer.compute_loss(fake, ss, batch))
    lora_before = [p.clone() for p in ss.base.parameters() if p.requires_grad]
    trainer = train_speculative_streaming(
        ss,
        states,
        output_dir="/tmp/ss_shared_test_trainer",
        max_steps=30,
        learning_rate=1e-2,
        batch_size=1,
        progress=False,
    )
    assert trainer.state.global_step == 30
    with torch.no_grad():
        after = float(SpeculativeStreamingTrainer.compute_loss(fake, ss, batch))
    assert after < 0.7 * before
    assert any(not torch.equal(a, b) for a, b in zip(lora_before, [p for p in ss.base.parameters() if p.requires_grad]))
    ref = ss.generate_autoregressive(ids, max_new_tokens=40, do_sample=False)
    out = ss.generate(
        ids, max_new_tokens=40, do_sample=False, return_dict_in_generate=True, speculative_tree=hfs.TreeSpec.chain(2)
    )
    assert torch.equal(out.sequences, ref)
    assert max(out.speculative_stats.accepted_lengths) > 1  # drafted tokens were accepted (cache compaction ran)


def test_shared_save_load_round_trip(tmp_path):
    """The folder holds config + streams (model.safetensors) + the LoRA adapter (PEFT adapter files); loading it
    onto a fresh copy of the base restores the same model."""
    _, ss = _shared("llama", seed=14, num_streams=2)
    ss.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    assert set(load_file(str(tmp_path / "model.safetensors"))) == {n for n, _ in ss.named_parameters()}
    lora = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))
    assert lora and all("lora_" in k for k in lora) and (tmp_path / "lora" / "adapter_config.json").is_file()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    want = ss.generate(ids, max_new_tokens=10, do_sample=False, return_dict_in_generate=True)
    for loader in (LlamaForSpeculativeStreaming.from_pretrained, AutoModel.from_pretrained):
        loaded = loader(tmp_path, base_model=tiny_model("llama", seed=14))
        assert loaded.config.mode == "shared"
        for a, b in zip(ss.trainable_parameters(), loaded.trainable_parameters()):
            assert torch.equal(a, b)
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, ss(ids).logits)
        got = loaded.generate(ids, max_new_tokens=10, do_sample=False, return_dict_in_generate=True)
        assert torch.equal(got.sequences, want.sequences)
        assert got.speculative_stats.accepted_lengths == want.speculative_stats.accepted_lengths


def test_cli_trains_shared_mode(tmp_path):
    """``hf-speculative train streaming --mode shared`` on a tiny chat model: LoRA + streams saved, reloadable; then
    ``train streaming-pruning`` adds the early exit to that folder, and its decoding stays exact."""
    import json

    from conftest import saved_chat_model_and_data

    from hf_speculative.cli import main

    _, _, _, data = saved_chat_model_and_data(tmp_path, num_layers=4)
    out = tmp_path / "out"
    argv = [
        "train",
        "streaming",
        "--mode",
        "shared",
        "--model",
        str(tmp_path / "base"),
        "--data",
        str(data),
        "--out",
        str(out),
    ]
    assert (
        main(
            argv
            + ["--max-steps", "3", "--num-msa-layers", "2", "--lora-rank", "4", "--holdout", "0.25", "--threads", "1"]
        )
        == 0
    )
    config = json.loads((out / "config.json").read_text())
    assert (
        config["mode"] == "shared"
        and config["training"]["steps_done"] == 3
        and config["training"]["lora_parameters"] > 0
    )
    assert (out / "lora" / "adapter_model.safetensors").is_file()
    ss = LlamaForSpeculativeStreaming.from_pretrained(out)  # loads the recorded base and the adapter
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(
        ss.generate(ids, max_new_tokens=6, do_sample=False),
        ss.generate_autoregressive(ids, max_new_tokens=6, do_sample=False),
    )
    # parallel tree pruning on the trained folder (the method's `fit_pruning_head`, as the task arms call it)
    pruned = tmp_path / "pruned"
    argv = [
        "train",
        "streaming-pruning",
        "--model",
        str(tmp_path / "base"),
        "--streams",
        str(out),
        "--data",
        str(data),
        "--out",
        str(pruned),
        "--pruning-layer",
        "1",
        "--max-steps",
        "2",
        "--holdout",
        "0.25",
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    pruning = json.loads((pruned / "config.json").read_text())["pruning"]
    assert pruning["steps"] == 2 and pruning["layer"] == 1 and pruning["held_out_top1_after"] is not None
    assert "streaming-pruning" in pruning["command"] and pruning["adapter_parameters"] > 0
    ss = LlamaForSpeculativeStreaming.from_pretrained(pruned)
    assert torch.equal(
        ss.generate(ids, max_new_tokens=6, do_sample=False),
        ss.generate_autoregressive(ids, max_new_tokens=6, do_sample=False),
    )


@pytest.mark.parametrize("mode", ["lossless", "shared"])
def test_one_token_steps_compute_no_streams(monkeypatch, mode):
    """When step pricing decodes one-token steps, the self-drafting model runs its main stream only: the streams'
    MSA layers and vocabulary projection run once per drafted tree, not once per step, and the output is unchanged."""
    from hf_speculative.engine.step_pricing import StepPricer

    base, ss = _ss(seed=3) if mode == "lossless" else _shared(seed=3)
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(0))
    ref = ss.generate(ids, max_new_tokens=24, do_sample=False, speculative_pricing=False)
    steps = {"n": 0, "drafted": 0}

    def draft_this_step(self):  # one drafted step in three
        steps["n"] += 1
        drafted = steps["n"] % 3 == 1
        steps["drafted"] += drafted
        return drafted

    monkeypatch.setattr(StepPricer, "draft_this_step", draft_this_step)
    computed = []
    for name in ("stream_states", "stream_head"):
        original = getattr(type(ss), name)
        monkeypatch.setattr(
            type(ss), name, lambda self, *a, _f=original, _n=name, **k: computed.append(_n) or _f(self, *a, **k)
        )
    out = ss.generate(ids, max_new_tokens=24, do_sample=False, speculative_pricing=True)
    assert torch.equal(out, ref)
    assert steps["drafted"] < steps["n"]
    # the vocabulary projection once per drafted tree, and in lossless mode the MSA layers too
    assert computed.count("stream_head") == steps["drafted"]
    assert computed.count("stream_states") == (steps["drafted"] if mode == "lossless" else 0)


@pytest.mark.parametrize("mode", ["lossless", "shared"])
def test_a_forward_in_another_thread_leaves_this_forwards_captures_alone(mode):
    """The forward's capturing hooks sit on the model's layers while it runs; a forward of the same model in another
    thread (a second generate() call) passes the same layers, and must not write into this forward's captures."""
    import threading

    base, ss = _shared() if mode == "shared" else _ss()
    mine, theirs = torch.randint(0, 96, (1, 6)), torch.randint(0, 96, (1, 4))
    with torch.no_grad():
        expected = ss(input_ids=mine, output_streams=True)
        fired = []

        def other_forward(module, args, output):  # once, in this thread, right after this forward's capture
            if not fired:
                fired.append(True)
                thread = threading.Thread(target=lambda: ss(input_ids=theirs, output_streams=True))
                thread.start()
                thread.join()

        first = ss.config.first_msa_layer
        layer = ss.model.layers[first if mode == "lossless" else first - 1]
        handle = layer.register_forward_hook(other_forward)
        try:
            out = ss(input_ids=mine, output_streams=True)
        finally:
            handle.remove()
    assert fired
    torch.testing.assert_close(out.logits, expected.logits, **FP32_LAYERS)
    torch.testing.assert_close(out.stream_logits, expected.stream_logits, **FP32_LAYERS)
