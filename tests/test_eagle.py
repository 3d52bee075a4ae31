"""EagleDrafter (EAGLE-1/2/3): greedy equality (fresh, trained, saved and reloaded), public checkpoint layouts with
the maths checked by hand, d2t mapping, the per-parent dynamic tree builder, training, sampling exactness."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_LAYERS, tiny_model
from test_drafter_protocol import begin_one, propose_one
from test_sampling import ALPHA, NEW, VOCAB, _batched_sample_counts, _exact_generate, chi_square_pvalue
from transformers import AutoModel, LlamaConfig

import hf_speculative as hfs
from hf_speculative.drafters.eagle import EagleDrafter, eagle3_feature_layers
from hf_speculative.drafters.eagle.training_eagle import (
    EagleCollator,
    EagleDataset,
    eagle_loss,
    hidden_states_from_model,
    train_eagle,
)

ARCHS = ["llama", "mistral", "qwen2"]
VARIANTS = ["eagle1", "eagle3"]
NUM_LAYERS = 6
TRAINED_LAYERS = 2


def _target(arch, seed=1, num_layers=NUM_LAYERS):
    return hfs.enable(tiny_model(arch, seed=seed, num_layers=num_layers))


def _training_sequences(model, n=32, length=48, seed=0):
    """The target's own greedy continuations of random prompts (what greedy speculative decoding must predict)."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(n):
        prompt = torch.randint(0, model.config.vocab_size, (1, 4), generator=g)
        seqs.append(model.generate(prompt, do_sample=False, max_new_tokens=length - 4)[0])
    return seqs


def _trained(arch, variant, max_steps=300, num_layers=TRAINED_LAYERS):
    """A drafter trained on a shallow target (whose greedy text one drafter layer can learn in seconds)."""
    model = _target(arch, num_layers=num_layers)
    drafter = EagleDrafter.from_base_model(model, variant=variant, draft_vocab_size=80 if variant == "eagle3" else None)
    layers = sorted(set(eagle3_feature_layers(num_layers)))
    states = hidden_states_from_model(model, _training_sequences(model), layers)
    if variant == "eagle3":
        from hf_speculative.drafters.draft_vocab import frequent_tokens

        drafter.set_draft_vocab(frequent_tokens(states.input_ids, 80, model.config.vocab_size))
    torch.manual_seed(0)
    trainer = train_eagle(
        drafter,
        states,
        "/tmp/eagle-test-train",
        max_steps=max_steps,
        batch_size=8,
        learning_rate=3e-3,
        logging_steps=10,
        progress=False,
        warmup_steps=2,
    )
    return model, drafter, states, trainer


# training is the same code for every family: both variants on Llama, EAGLE-3 on Qwen2 (attention biases); every
# family's drafting is covered untrained (test_greedy_equality_fresh) and in batches (test_batch)
TRAINED_SETTINGS = [("llama", "eagle1"), ("llama", "eagle3"), ("qwen2", "eagle3")]


@pytest.fixture(scope="module", params=TRAINED_SETTINGS, ids=lambda p: f"{p[0]}-{p[1]}")
def trained(request):
    return _trained(*request.param)


TREES = [
    None,
    hfs.DynamicTree(total_tokens=10, depth=4, top_k=3),
    hfs.TreeSpec.cartesian([2, 2, 1]),
    hfs.TreeSpec.chain(4),
]


def _check_greedy(model, drafter, prompts, max_new_tokens=40):
    taus = []
    for prompt in prompts:
        ref = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
        for tree in TREES:
            out = model.generate(
                prompt,
                assistant_model=drafter,
                speculative_tree=tree,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                return_dict_in_generate=True,
            )
            assert torch.equal(out.sequences, ref), (tree, out.sequences, ref)
            taus.append(out.speculative_stats.mean_accepted_length)
    return sum(taus) / len(taus)


PROMPTS = [torch.tensor([[1, 5, 7, 9, 11]]), torch.tensor([[3]]), torch.tensor([[40, 2, 2, 2, 8, 60, 1]])]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_equality_fresh(arch, variant):
    model = _target(arch, seed=3)
    drafter = EagleDrafter.from_base_model(model, variant=variant, draft_vocab_size=50 if variant == "eagle3" else None)
    _check_greedy(model, drafter, PROMPTS, max_new_tokens=24)


@pytest.mark.slow
def test_training_lowers_loss_and_greedy_equality_trained_saved_reloaded(trained, tmp_path):
    model, drafter, states, trainer = trained
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < 0.7 * losses[0], losses
    seen = [seq[None, :4] for seq in _training_sequences(model)[:3]]  # prompts whose greedy text it trained on
    tau = _check_greedy(model, drafter, seen + PROMPTS[:1])
    assert tau > 1.1, tau  # the trained drafter's drafts are accepted: multi-token paths are exercised
    drafter.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "eagle_drafter" and saved["variant"] == drafter.config.variant
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert not any("embed" in k for k in keys)  # the target's embedding is shared, never saved
    assert (
        ("midlayer.hidden_norm.weight" in keys and "d2t" in keys)
        if drafter.config.is_eagle3
        else "layers.0.self_attn.q_proj.weight" in keys
    )
    for loaded in (EagleDrafter.from_pretrained(tmp_path, base_model=model), AutoModel.from_pretrained(tmp_path)):
        assert type(loaded) is EagleDrafter
        for k, v in drafter.state_dict().items():
            torch.testing.assert_close(loaded.state_dict()[k], v)
        assert _check_greedy(model, loaded, PROMPTS[:1]) > 1.0


def test_training_time_test_unrolled_steps_match_drafting():
    """EAGLE-3's training-time test computes, at unrolled step s, row j, exactly what tree drafting computes for the
    depth-(s+1) node on the path x_{j+2} .. : the drafter's own chain, attending to the committed rows <= j."""
    model = _target("llama")
    drafter = EagleDrafter.from_base_model(model, variant="eagle3").float()
    seq = torch.tensor([5, 9, 3, 17, 2, 44, 8, 61, 30, 7])
    states = hidden_states_from_model(model, [seq], sorted(set(eagle3_feature_layers(NUM_LAYERS))))
    ds = EagleDataset(states, drafter.config.feature_layers(NUM_LAYERS), NUM_LAYERS)
    batch = EagleCollator()([ds[0]])
    steps = 3
    orig = drafter.compute_logits
    calls = []
    drafter.compute_logits = lambda rows: calls.append(rows.detach().clone()) or orig(rows)
    eagle_loss(drafter, batch, steps=steps)
    drafter.compute_logits = orig
    # by hand, row j = 2 along the true path: committed rows 0..j from the real features, then the drafter's chain
    j, feats = 2, batch["features"][0]
    with torch.no_grad():
        out = drafter(seq[None, 1 : j + 2], target_features=feats[None, : j + 1], use_cache=True)
        kv, hidden = out.cache, out.hidden_states[0, -1]
        torch.testing.assert_close(calls[0][j], hidden, **FP32_LAYERS)
        for s in range(1, steps):
            mask = torch.zeros(1, 1, 1, kv[0].shape[2] + 1)  # the committed rows <= j and the chain: all visible
            o = drafter(
                seq[None, j + 1 + s : j + 2 + s],
                hidden=hidden[None, None],
                position_ids=torch.tensor([[j + s]]),
                attention_mask=mask,
                cache=kv,
                use_cache=True,
            )
            kv, hidden = o.cache, o.hidden_states[0, 0]
            # step s's loss projected its valid rows in order; row j is the j-th (all rows of one sequence are valid)
            torch.testing.assert_close(calls[s][j], hidden, **FP32_LAYERS)


# --------------------------------------------------------------------------- public checkpoint layouts
def _public_config(model, **extra):
    c = model.config
    cfg = LlamaConfig(
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        num_hidden_layers=1,
        vocab_size=c.vocab_size,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
    ).to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg.update(extra)
    return cfg


def _rand_state(shapes: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        k: (0.3 * torch.randn(s, generator=g) if len(s) == 2 else 1 + 0.1 * torch.randn(s, generator=g))
        for k, s in shapes.items()
    }


def _layer_shapes(prefix, H, I, nh, nkv, hd, attn_in):
    return {
        f"{prefix}.self_attn.q_proj.weight": (nh * hd, attn_in),
        f"{prefix}.self_attn.k_proj.weight": (nkv * hd, attn_in),
        f"{prefix}.self_attn.v_proj.weight": (nkv * hd, attn_in),
        f"{prefix}.self_attn.o_proj.weight": (H, nh * hd),
        f"{prefix}.mlp.gate_proj.weight": (I, H),
        f"{prefix}.mlp.up_proj.weight": (I, H),
        f"{prefix}.mlp.down_proj.weight": (H, I),
        f"{prefix}.post_attention_layernorm.weight": (H,),
    }


def _rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _layer_by_hand(sd, prefix, attn_in, residual, nh, nkv, hd, eps):
    """One causal decoder layer over rows at positions 0..T-1, written out by hand."""
    T = attn_in.shape[0]
    q = (attn_in @ sd[f"{prefix}.self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)
    k = (attn_in @ sd[f"{prefix}.self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    v = (attn_in @ sd[f"{prefix}.self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    pos = torch.arange(T)
    q, k = _rope(q, pos), _rope(k, pos)
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    scores = q @ k.transpose(-1, -2) / hd**0.5 + torch.full((T, T), float("-inf")).triu(1)
    attn = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(T, nh * hd) @ sd[
        f"{prefix}.self_attn.o_proj.weight"
    ].T
    h = residual + attn
    m = _rms(h, sd[f"{prefix}.post_attention_layernorm.weight"], eps)
    mlp = (F.silu(m @ sd[f"{prefix}.mlp.gate_proj.weight"].T) * (m @ sd[f"{prefix}.mlp.up_proj.weight"].T)) @ sd[
        f"{prefix}.mlp.down_proj.weight"
    ].T
    return h + mlp


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("arch", ARCHS)
def test_public_eagle1_checkpoint(arch, fmt, tmp_path):
    model = _target(arch, seed=5)
    c = model.config
    H, I, nh, nkv = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads
    hd = H // nh
    shapes = {"fc.weight": (H, 2 * H), "fc.bias": (H,), **_layer_shapes("layers.0", H, I, nh, nkv, hd, H)}
    sd = _rand_state(shapes, seed=11)
    sd["fc.bias"] = 0.1 * sd["fc.bias"]
    sd["embed_tokens.weight"] = torch.zeros(
        c.vocab_size, H
    )  # some exports carry the embedding: ignored, the target's is used
    (tmp_path / "config.json").write_text(json.dumps(_public_config(model)))
    if fmt == "bin":
        torch.save(sd, tmp_path / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(sd, str(tmp_path / "model.safetensors"))
    drafter = EagleDrafter.from_pretrained(tmp_path, base_model=model)
    assert (
        drafter.config.variant == "eagle1"
        and drafter.config.fc_bias
        and drafter.config.feature_layers() == [NUM_LAYERS]
    )
    # the maths by hand: g = Layer(fc([e(x_{j+1}); f_j])), logits = target lm_head(g)
    seq = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        out = model(seq, output_hidden_states=True)
        f = out.hidden_states[NUM_LAYERS][0]  # the post-norm final state
        e = model.get_input_embeddings()(seq)[0]
        x = torch.cat([e[1:], f[:-1]], -1) @ sd["fc.weight"].T + sd["fc.bias"]
        g = _layer_by_hand(sd, "layers.0", x, x, nh, nkv, hd, c.rms_norm_eps)
        logits = g @ model.get_output_embeddings().weight.T
        mine = drafter(seq[:, 1:], target_features=drafter.target_features(out.hidden_states)[:, :-1])
    torch.testing.assert_close(mine.hidden_states[0], g, **FP32_LAYERS)
    torch.testing.assert_close(mine.logits[0], logits, **FP32_LAYERS)
    # in use: the first drafted token of generate() is the argmax of the last row
    tree_drafter = drafter.get_tree_drafter(model)
    with torch.no_grad():
        prefill = model(seq[:, :-1], output_hidden_states=True)
    begin_one(tree_drafter, seq[:, :-1], prefill)
    draft = propose_one(tree_drafter, seq, hfs.TreeSpec.chain(1), hfs.DraftingOptions())
    assert int(draft.tokens[1]) == int(logits[-1].argmax())
    _check_greedy(model, drafter, PROMPTS[:2], max_new_tokens=16)


@pytest.mark.parametrize("arch", ARCHS)
def test_public_eagle3_checkpoint(arch, tmp_path):
    model = _target(arch, seed=6)
    c = model.config
    H, I, nh, nkv, V = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size
    hd, Vd = H // nh, 40
    shapes = {
        "fc.weight": (H, 3 * H),
        **_layer_shapes("midlayer", H, I, nh, nkv, hd, 2 * H),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.input_layernorm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (Vd, H),
    }
    sd = _rand_state(shapes, seed=12)
    g = torch.Generator().manual_seed(3)
    draft_ids = torch.randperm(V, generator=g)[:Vd].sort().values
    sd["d2t"] = draft_ids - torch.arange(Vd)
    sd["t2d"] = torch.zeros(V, dtype=torch.bool)
    sd["t2d"][draft_ids] = True
    (tmp_path / "config.json").write_text(
        json.dumps(_public_config(model, draft_vocab_size=Vd, architectures=["LlamaForCausalLMEagle3"]))
    )
    torch.save(sd, tmp_path / "pytorch_model.bin")
    drafter = EagleDrafter.from_pretrained(tmp_path, base_model=model)
    assert drafter.config.variant == "eagle3" and drafter.config.draft_vocab_size == Vd
    low, mid, high = drafter.config.feature_layers(NUM_LAYERS)
    assert (low, mid, high) == (2, NUM_LAYERS // 2, NUM_LAYERS - 3)
    seq = torch.tensor([[4, 8, 15, 16, 23, 42, 7]])
    eps = c.rms_norm_eps
    with torch.no_grad():
        out = model(seq, output_hidden_states=True)
        hs = out.hidden_states
        feats = torch.cat([hs[low][0], hs[mid][0], hs[high][0]], -1)[:-1]  # f_j for rows j = 0..T-2
        f = feats @ sd["fc.weight"].T
        e = model.get_input_embeddings()(seq)[0, 1:]
        attn_in = torch.cat(
            [_rms(e, sd["midlayer.input_layernorm.weight"], eps), _rms(f, sd["midlayer.hidden_norm.weight"], eps)], -1
        )
        gh = _layer_by_hand(sd, "midlayer", attn_in, f, nh, nkv, hd, eps)
        draft_logits = _rms(gh, sd["norm.weight"], eps) @ sd["lm_head.weight"].T
        mine = drafter(seq[:, 1:], target_features=drafter.target_features(hs)[:, :-1])
    torch.testing.assert_close(mine.hidden_states[0], gh, **FP32_LAYERS)
    torch.testing.assert_close(mine.logits[0], draft_logits, **FP32_LAYERS)
    # in use, with the d2t mapping: the depth-1 candidates are the top draft ids mapped to target ids
    tree_drafter = drafter.get_tree_drafter(model)
    with torch.no_grad():
        prefill = model(seq[:, :-1], output_hidden_states=True)
    begin_one(tree_drafter, seq[:, :-1], prefill)
    draft = propose_one(tree_drafter, seq, hfs.TreeSpec.cartesian([3]), hfs.DraftingOptions())
    expected = draft_ids[draft_logits[-1].topk(3).indices]
    assert draft.tokens[1:].tolist() == expected.tolist()
    assert bool(drafter.t2d[draft.tokens[1:]].all())
    _check_greedy(model, drafter, PROMPTS[:2], max_new_tokens=16)


def test_d2t_mapping():
    model = _target("llama", seed=7)
    drafter = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=5)
    ids = torch.tensor([3, 10, 11, 50, 95])
    drafter.set_draft_vocab(ids)
    assert drafter.d2t.tolist() == [3, 9, 9, 47, 91]  # target id = draft id + d2t[draft id]
    assert drafter.draft_to_target_ids(torch.tensor([0, 4, 2])).tolist() == [3, 95, 11]
    assert drafter.t2d.nonzero().flatten().tolist() == ids.tolist()
    torch.testing.assert_close(drafter.lm_head.weight, model.get_output_embeddings().weight[ids])
    # drafting proposes target ids from the draft vocabulary only (the rest has zero draft probability)
    out = model.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=8, do_sample=False))
    td = drafter.get_tree_drafter(model)
    with torch.no_grad():
        begin_one(td, torch.tensor([[1, 2]]), model(torch.tensor([[1, 2]]), output_hidden_states=True))
    draft = propose_one(
        td, torch.tensor([[1, 2, 3]]), hfs.DynamicTree(total_tokens=12, depth=3, top_k=4), hfs.DraftingOptions()
    )
    assert set(draft.tokens[1:].tolist()) <= set(ids.tolist()) | {1, 2}  # the prompt's tokens join (next test)
    with pytest.raises(ValueError, match="distinct"):
        drafter.set_draft_vocab(torch.tensor([1, 1, 2, 3, 4]))


def test_context_tokens_join_the_draft_vocabulary():
    """EAGLE-3 with a reduced draft vocabulary drafts the prompt's tokens too, scored with the target's head rows;
    each call starts from the draft vocabulary again, and greedy output is unchanged."""
    from hf_speculative.engine.logits import vocab_logits

    model = _target("llama", seed=7)
    drafter = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=5)
    ids = torch.tensor([3, 10, 11, 50, 95])
    drafter.set_draft_vocab(ids)  # its head rows are the target's: every extended logit is the target head's
    prompt = torch.tensor([[60, 1, 3, 2, 60]])
    td = drafter.get_tree_drafter(model)
    with torch.no_grad():
        begin_one(td, prompt, model(prompt, output_hidden_states=True))
        assert td._target_ids.tolist() == [3, 10, 11, 50, 95, 1, 2, 60]
        hidden = torch.randn(2, drafter.config.hidden_size)
        full = vocab_logits(drafter.norm(hidden), model.get_output_embeddings().weight)
        torch.testing.assert_close(td._logits(hidden), full[:, td._target_ids], rtol=1e-5, atol=1e-5)
    tree = hfs.DynamicTree(total_tokens=12, depth=3, top_k=4)
    draft = propose_one(td, torch.cat([prompt, torch.tensor([[7]])], 1), tree, hfs.DraftingOptions())
    assert set(draft.tokens[1:].tolist()) <= set(td._target_ids.tolist())
    td.end()
    assert td._target_ids.tolist() == ids.tolist() and td._extra_rows is None

    drafter.config.context_tokens = False
    off_ids, off_rows = drafter.get_tree_drafter(model)._context_vocab(prompt)
    assert off_ids.tolist() == ids.tolist() and off_rows is None
    drafter.config.context_tokens = True
    for p in (prompt, PROMPTS[2]):
        ref = model.generate(p, max_new_tokens=16, do_sample=False)
        assert torch.equal(model.generate(p, assistant_model=drafter, max_new_tokens=16, do_sample=False), ref)


def test_context_tokens_are_trained_as_drafting_scores_them():
    """EAGLE-3 training gives each sequence the columns its drafting has: the draft vocabulary, then its prompt's
    tokens outside it scored by the target's head rows (as `_logits` scores them while drafting); the teacher's ids
    map onto those columns and back, and the KD counts a copied token the draft vocabulary lacks."""
    from hf_speculative.drafters.eagle.training_eagle import _unrolled_steps

    model = _target("llama", seed=7, num_layers=TRAINED_LAYERS)
    drafter = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=5)
    drafter.set_draft_vocab(torch.tensor([3, 10, 11, 50, 95]))
    layers = sorted(set(eagle3_feature_layers(TRAINED_LAYERS)))
    seqs = [torch.tensor([60, 1, 3, 2, 60, 7, 3, 10, 60, 2, 11, 50]), torch.tensor([7, 8, 3, 3, 10, 11, 50, 3])]
    states = hidden_states_from_model(model, seqs, layers)
    states.labels[:5] = -100  # the first prompt: 60 1 3 2 60
    states.labels[12:14] = -100  # the second: 7 8
    dataset = EagleDataset(states, drafter.config.feature_layers(TRAINED_LAYERS), TRAINED_LAYERS)
    assert [dataset[i]["context_ids"].tolist() for i in range(2)] == [[1, 2, 3, 60], [7, 8]]
    batch = EagleCollator()([dataset[0], dataset[1]])
    assert batch["context_ids"].tolist() == [[1, 2, 3, 60], [7, 8, -1, -1]]
    batch["topk_ids"][0, :, 0] = 60  # the first sequence's teacher copies 60, outside the draft vocabulary
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        for _s, rows, logits, _tid, _tlp, index, columns in _unrolled_steps(drafter.eval(), batch, steps=2):
            assert logits.shape[-1] == 5 + 3  # the widest sequence's context tokens: 1, 2, 60
            first = index.nonzero().reshape(-1) < batch["input_ids"].shape[1] - 1  # rows of the first sequence
            drafting = drafter.compute_logits(rows[first], head[torch.tensor([1, 2, 60])])
            torch.testing.assert_close(logits[first], drafting, rtol=1e-5, atol=1e-5)
            assert (logits[~first][:, 5 + 2] == torch.finfo(logits.dtype).min).all()  # its padded column
            ids = torch.tensor([[60, 3, 7]]).expand(int(first.sum()), 3)
            assert columns.columns(torch.cat([ids, ids[: int((~first).sum())]]))[0].tolist() == [7, 0, -1]
            cols = torch.arange(8).expand(rows.shape[0], 8)
            assert columns.target_ids(cols)[0].tolist() == [3, 10, 11, 50, 95, 1, 2, 60]
        on, _ = eagle_loss(drafter, batch, steps=2)
        drafter.config.context_tokens = False
        off, parts = eagle_loss(drafter, batch, steps=2)
    assert float(on) > float(off) > 0  # off: the teacher's mass on 60 has no column and is dropped
    assert "acc_0" in parts


def test_dynamic_tree_grow_hand_example():
    """EAGLE-2 Sec. 4 with one distribution per parent. Vocabulary of 4, top_k = 2, depth 3, 5 nodes kept.

    depth 1 (root): A=token0 .6, B=token1 .3
    depth 2: A's children (from A's distribution) 2 .5 (A2 .30), 3 .4 (A3 .24); B's: 0 .9 (B0 .27), 1 .05 (B1 .015)
    depth 3 expands the 2 best of depth 2, A2 (.30) and B0 (.27): A2's children 1 .7 (.21), 0 .2 (.06);
    B0's children 3 .8 (.216), 2 .1 (.027).
    Rerank to 5: A .6, B .3, A2 .30 (tie with B: the earlier node first), B0 .27, A3 .24.
    """
    lp = lambda *p: torch.tensor(p).log()  # noqa: E731
    rows = {
        (0,): lp(0.1, 0.2, 0.5, 0.4) - 0,
        (1,): lp(0.9, 0.05, 0.03, 0.02),
        (0, 2): lp(0.2, 0.7, 0.05, 0.05),
        (1, 0): lp(0.05, 0.05, 0.1, 0.8),
    }
    rows[(0,)] = lp(0.05, 0.05, 0.5, 0.4)
    calls = []

    def expand(depth, frontier, tokens, parents):
        out = []
        for c in frontier:
            path, p = [int(tokens[c])], int(parents[c])
            while p >= 0:
                path.insert(0, int(tokens[p]))
                p = int(parents[p])
            out.append(rows[tuple(path)])
        calls.append((depth, [tuple(int(tokens[c]) for c in frontier)]))
        return torch.stack(out)

    tree = hfs.DynamicTree(total_tokens=5, depth=3, top_k=2).grow(lp(0.6, 0.3, 0.05, 0.05), expand, 9)
    assert tree.tokens.tolist() == [9, 0, 1, 2, 3, 0]
    assert tree.parents == (-1, 0, 0, 1, 1, 2)
    assert [d for d, _ in calls] == [1, 2]
    big = hfs.DynamicTree(total_tokens=8, depth=3, top_k=2).grow(lp(0.6, 0.3, 0.05, 0.05), expand, 9)
    # + B0's child 3 (.216), A2's child 1 (.21), A2's child 0 (.06); A3 .24 stays
    assert big.tokens.tolist() == [9, 0, 1, 2, 3, 0, 1, 0, 3]
    assert big.parents == (-1, 0, 0, 1, 1, 2, 3, 3, 5)


@pytest.mark.slow
@pytest.mark.parametrize(  # one case a tree: the two pytest-xdist workers share them
    "tree",
    [hfs.TreeSpec.cartesian([3, 2, 1]), hfs.DynamicTree(total_tokens=6, depth=3, top_k=2)],
    ids=["static-tree", "dynamic-tree"],
)
def test_sampling_matches_target_distribution(tree):
    target = hfs.enable(tiny_model("llama", seed=21, vocab_size=VOCAB, num_layers=2))
    drafter = EagleDrafter.from_base_model(target, variant="eagle3", init_from_target=False)
    with torch.no_grad():  # a drafter whose distribution is far from the target's but not degenerate
        for p in drafter.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    prompt = torch.tensor([[1, 5, 2]])
    kw = dict(temperature=0.7, top_k=4, top_p=1.0)
    exact = _exact_generate(target, prompt, **kw)
    n = 2000
    torch.manual_seed(1234)
    gen = dict(do_sample=True, max_new_tokens=NEW, top_k=4, temperature=0.7)
    counts = _batched_sample_counts(
        lambda ids, mask: target.generate(
            ids, attention_mask=mask, assistant_model=drafter, speculative_tree=tree, **gen
        ),
        prompt,
        n,
    )
    assert chi_square_pvalue(counts, exact, n) > ALPHA, tree


def test_clear_errors(tmp_path):
    model = _target("llama", seed=8)
    drafter = EagleDrafter.from_base_model(model, variant="eagle2")
    assert drafter.config.variant == "eagle2" and not drafter.config.is_eagle3
    other = hfs.enable(tiny_model("llama", seed=8, vocab_size=64, num_layers=2))
    with pytest.raises(ValueError, match="vocab_size"):
        other.generate(torch.tensor([[1, 2]]), assistant_model=drafter, max_new_tokens=4)
    (tmp_path / "config.json").write_text(json.dumps(_public_config(model)))
    torch.save({"foo.weight": torch.zeros(2, 2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="not an EAGLE checkpoint"):
        EagleDrafter.from_pretrained(tmp_path, base_model=model)
    with pytest.raises(ValueError, match="variant"):
        hfs.EagleConfig(variant="eagle4")


@pytest.mark.parametrize("arch", ARCHS)
def test_init_from_target_copies_the_last_layer(arch):
    model = _target(arch, seed=9, num_layers=2)
    last, H = model.model.layers[-1], model.config.hidden_size
    eagle1 = EagleDrafter.from_base_model(model, variant="eagle1")
    layer = eagle1.layers[0]
    for name in ("mlp", "post_attention_layernorm", "self_attn"):
        theirs = getattr(last, name).state_dict()
        for key, value in getattr(layer, name).state_dict().items():
            torch.testing.assert_close(value, theirs[key], rtol=0, atol=0)
    torch.testing.assert_close(eagle1.fc.weight, torch.cat([torch.zeros(H, H), torch.eye(H)], dim=1), rtol=0, atol=0)
    eagle3 = EagleDrafter.from_base_model(model, variant="eagle3", draft_vocab_size=40)
    mid = eagle3.midlayer
    for name in ("mlp", "post_attention_layernorm"):
        theirs = getattr(last, name).state_dict()
        for key, value in getattr(mid, name).state_dict().items():
            torch.testing.assert_close(value, theirs[key], rtol=0, atol=0)
    torch.testing.assert_close(eagle3.norm.weight, model.model.norm.weight, rtol=0, atol=0)
    torch.testing.assert_close(eagle3.lm_head.weight, model.lm_head.weight[:40], rtol=0, atol=0)
    # the 2H-input attention and the 3H-input fc have no counterpart in the target: their own (random) init
    assert mid.self_attn.q_proj.weight.shape[1] == 2 * H and eagle3.fc.weight.shape[1] == 3 * H
    assert not torch.equal(mid.self_attn.o_proj.weight, last.self_attn.o_proj.weight)


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_init_from_a_mismatched_target_raises(variant):
    """A target whose last decoder layer is not what its config says (a pruned MLP, another attention): the drafter
    cannot start from it, and says so instead of keeping random weights."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    model = _target("llama", seed=10, num_layers=2)
    last, H = model.model.layers[-1], model.config.hidden_size
    last.mlp = LlamaMLP(LlamaConfig(hidden_size=H, intermediate_size=48))
    with pytest.raises(ValueError, match=r"cannot initialise the EAGLE drafter's mlp .*gate_proj.weight of shape"):
        EagleDrafter.from_base_model(model, variant=variant)
    drafter = EagleDrafter.from_base_model(model, variant=variant, init_from_target=False)
    assert drafter.layer.mlp.gate_proj.weight.shape == (model.config.intermediate_size, H)
    if variant == "eagle1":  # EAGLE-1 copies the attention too
        model = _target("llama", seed=10, num_layers=2)
        model.model.layers[-1].self_attn.k_proj = torch.nn.Linear(H, 4, bias=False)
        with pytest.raises(ValueError, match=r"drafter's self_attn .*: k_proj.weight of shape \(4, 32\)"):
            EagleDrafter.from_base_model(model, variant=variant)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_batched_greedy_equality_with_ragged_prompts(arch, variant):
    # the batched engine runs the EAGLE drafter per row through the TreeDrafter default contract; each row is exact
    model = hfs.enable(tiny_model(arch, seed=1))
    drafter = EagleDrafter.from_base_model(model, variant=variant)
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :2] = 0
    ids[mask == 0] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    out = model.generate(
        ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=20, do_sample=False, pad_token_id=0
    )
    assert torch.equal(out, ref)


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_batched_drafting_equals_drafting_row_by_row(variant, monkeypatch):
    """A batch's static top-k trees, drafted for every row in one drafter forward per depth (`propose_rows`: the
    rows' committed caches padded to one block), are the trees each row drafts alone: same tokens, same path
    confidences, at every step of ragged rows."""
    import copy

    from hf_speculative.drafters.eagle import drafting, modeling_eagle

    model = hfs.enable(tiny_model("qwen2", seed=4))
    drafter = EagleDrafter.from_base_model(model, variant=variant, draft_vocab_size=50 if variant == "eagle3" else None)
    real, steps = drafting.propose_rows, []

    def checked(drafters, sequences, tree, options):
        alone = [copy.copy(d) for d in drafters]  # the row state a batched step replaces, not mutates
        drafts = real(drafters, sequences, tree, options)
        for one, seq, draft in zip(alone, sequences, drafts):
            (expected,) = real([one], [seq], tree, options)
            assert draft.tokens.tolist() == expected.tokens.tolist() and draft.parents == expected.parents
            # float32 rounding only: the batch attends over a padded block (another summation order; on an AMD EPYC
            # with AVX-512 the path confidences differed by up to 1.4e-5)
            torch.testing.assert_close(torch.tensor(draft.scores), torch.tensor(expected.scores), rtol=1e-4, atol=1e-4)
        steps.append(len(drafts))
        return drafts

    monkeypatch.setattr(modeling_eagle, "propose_rows", checked)
    ids = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :2] = 0
    ids[mask == 0] = 0
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    for tree in (hfs.TreeSpec.cartesian([2, 2, 1]), hfs.TreeSpec.chain(3)):
        out = model.generate(
            ids, attention_mask=mask, assistant_model=drafter, speculative_tree=tree, max_new_tokens=12, pad_token_id=0
        )
        assert torch.equal(out, ref)
    assert len(steps) > 4 and max(steps) == 3  # the rows drafted together
    # a step where a hybrid's gate left every row out asks for no drafts
    td = drafter.get_tree_drafter(model)
    assert td.propose_batch([], [], hfs.TreeSpec.chain(2), hfs.DraftingOptions()) == []


def test_calibrated_drafter_sizes_its_tree_for_the_machine(monkeypatch):
    """Held-out accuracies per unrolled step and rank (the calibration) agree with the training metric, and a
    calibrated drafter's default tree is the cost-aware static tree on the target's curve; greedy stays exact."""
    from hf_speculative.drafters.eagle.training_eagle import eagle_step_accuracies
    from hf_speculative.perf_model import CostCurve
    from hf_speculative.perf_model.cost_curve import set_cost_curve

    model, drafter, states, _ = _trained("llama", "eagle3")
    dataset = EagleDataset(states, drafter.config.feature_layers(TRAINED_LAYERS), TRAINED_LAYERS)
    acc = eagle_step_accuracies(drafter, states, steps=3, top=3, batch_size=len(dataset))
    assert len(acc) == 3 and all(len(row) == 3 and 0 <= min(row) and sum(row) <= 1 + 1e-9 for row in acc)
    batch = EagleCollator()([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        _, parts = eagle_loss(drafter.eval(), batch, steps=3)
    for s in range(3):  # rank 0 of step s is the training log's top-1 agreement acc_s
        assert acc[s][0] == pytest.approx(float(parts[f"acc_{s}"]), abs=1e-6)
    assert acc[0][0] > 0.3  # trained: the test below sizes a real tree

    monkeypatch.setenv("HF_SPECULATIVE_COST_AWARE", "1")  # the suite's default is off (fixed trees)
    assert isinstance(drafter.get_tree_drafter(model).default_tree, hfs.DynamicTree)  # no calibration: EAGLE-2's
    drafter.config.calibration = {"step_top_i_accuracy": acc}
    set_cost_curve(model, CostCurve(nodes=(1, 4, 16, 64), ratios=(1.0, 1.1, 1.3, 2.5)))
    try:
        tree_drafter = drafter.get_tree_drafter(model)
        tree = tree_drafter.default_tree
        assert isinstance(tree, hfs.TreeSpec) and 1 <= tree.depth <= 3
        cost = tree_drafter.draft_cost(CostCurve(nodes=(1, 64), ratios=(1.0, 2.0)))
        assert cost[0] > 0 and cost[2] == pytest.approx(3 * cost[0])  # one drafter forward per depth
        ref = model.generate(PROMPTS[0], max_new_tokens=24, do_sample=False)
        out = model.generate(PROMPTS[0], assistant_model=drafter, max_new_tokens=24, do_sample=False)
        assert torch.equal(out, ref)
    finally:
        set_cost_curve(model, None)


@pytest.mark.parametrize("variant", VARIANTS)
def test_committed_pass_computes_only_the_last_rows_output(variant):
    """``output_rows``: the output of one row per batch row (queries, ``o_proj`` and MLP on that row alone) equals
    that row of the full pass, over a cache and a ragged mask; the keys and values cached are every row's."""
    from hf_speculative.drafters.eagle.drafting import _additive

    model = _target("llama", seed=5)
    drafter = EagleDrafter.from_base_model(model, variant=variant, draft_vocab_size=50 if variant == "eagle3" else None)
    g = torch.Generator().manual_seed(0)
    B, P, T = 3, 4, 6
    width = drafter.fc.in_features if variant == "eagle3" else model.config.hidden_size
    feats = torch.randn(B, T, width, generator=g)
    ids = torch.randint(1, 90, (B, T), generator=g)
    heads, dim = drafter.config.num_key_value_heads, drafter.config.head_dim
    past = (torch.randn(B, heads, P, dim, generator=g), torch.randn(B, heads, P, dim, generator=g))
    visible = torch.ones(T, P + T, dtype=torch.bool)
    visible[:, P:] = torch.ones(T, T, dtype=torch.bool).tril()
    visible = visible.expand(B, T, P + T).clone()
    visible[1, :, :2] = False  # a row with less cached past
    mask = _additive(visible, torch.float32)
    positions = torch.arange(P, P + T)[None].expand(B, T)
    common = dict(target_features=feats, position_ids=positions, attention_mask=mask, cache=past, use_cache=True)
    full = drafter(ids, **common)
    last = torch.tensor([5, 2, 0])
    some = drafter(ids, output_rows=last, **common)
    assert some.hidden_states.shape == (B, 1, full.hidden_states.shape[-1])
    for b, r in enumerate(last.tolist()):
        torch.testing.assert_close(some.hidden_states[b, 0], full.hidden_states[b, r])
        torch.testing.assert_close(some.logits[b, 0], full.logits[b, r])
    for mine, theirs in zip(some.cache, full.cache):
        torch.testing.assert_close(mine, theirs)
