"""The roofline study (benchmarks/roofline) built on the cost model (SPIRe's throughput multiplier): exact limits on toy numbers, the parameter count
against real models, the trends of Fig. 4, the CPU measurement's cache, and the ``perf-model`` command."""

from __future__ import annotations

import json

import pytest
import torch
from roofline import HARDWARE, Hardware, expected_tau, forward_time, speedup_grid, step_times, throughput_multiplier
from roofline.cli import main
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hf_speculative.perf_model import SHAPES, ModelShape, projected_speedup

#: hidden 4, 1 layer, 2 heads of 2, 1 kv head, vocab 10: small enough to count by hand
TOY = ModelShape(
    "toy", hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, vocab=10, tied=True, dtype_bytes=1
)
UNIT = Hardware("unit", flops=1.0, bandwidth=1.0)  # time = max(FLOPs, bytes)


def test_toy_counts_by_hand():
    # attention q 4x4 + k 4x2 + v 4x2 + o 4x4 = 48; MLP 3*4*8 = 96; norms 2*4 = 8 -> layer 152
    assert TOY.layer_params == 152
    assert TOY.num_parameters == 40 + 152 + 4  # embedding (tied head) + layer + final norm
    assert TOY.forward_params == 152 + 4 + 40  # layer + final norm + LM head
    assert TOY.kv_bytes_per_token == 2 * 1 * 1 * 2 * 1
    # B=3 rows, n=2 new tokens, L=5: 6 tokens x (2 * 196 + 4 * 5 * 2 * 2 * 1) FLOPs
    assert TOY.forward_flops(3, 2, 5) == 6 * (392 + 80)
    assert TOY.forward_bytes(3, 2, 5) == 196 + 3 * 5 * 4
    # a sparse window of 3 caps L_eff
    assert TOY.forward_flops(3, 2, 5, kv_window=3) == 6 * (392 + 48)
    assert TOY.forward_bytes(3, 2, 5, kv_window=3) == 196 + 3 * 3 * 4
    assert TOY.forward_bytes(3, 2, 2, kv_window=3) == 196 + 3 * 2 * 4  # a window longer than the context


def test_compute_bound_and_memory_bound_limits_exactly():
    # unit hardware: compute-bound (FLOPs > bytes) in both cases here, time = FLOPs
    assert forward_time(TOY, UNIT, 3, 2, 5) == 6 * 472
    # memory-bound: a machine with huge FLOP/s leaves only the bytes
    fast = Hardware("fast", flops=1e30, bandwidth=2.0)
    assert forward_time(TOY, fast, 3, 2, 5) == pytest.approx((196 + 60) / 2.0)
    # compute-bound: huge bandwidth leaves only the FLOPs
    wide = Hardware("wide", flops=4.0, bandwidth=1e30)
    assert forward_time(TOY, wide, 3, 2, 5) == pytest.approx(6 * 472 / 4.0)
    # the crossover: HOI is FLOP/s over bytes/s
    assert Hardware("x", 10.0, 4.0).hoi == 2.5
    assert HARDWARE["h100"].hoi == pytest.approx(989e12 / 3.35e12)


def test_multiplier_is_tau_over_delta_t():
    # memory-bound everywhere (L = 0, B = 1): every forward of a model costs its weights; vanilla with TOY as its own
    # draft costs k + 1 plain steps, so the multiplier is tau / (k + 1)
    fast = Hardware("fast", flops=1e30, bandwidth=1.0)
    t = step_times("vanilla", TOY, TOY, fast, batch=1, context=0, k=3)
    assert (t.plain, t.draft, t.verify, t.memory) == (196, 3 * 196, 196, 0.0)
    assert t.delta_t == 4
    assert throughput_multiplier("vanilla", TOY, TOY, fast, 1, 0, 3, tau=2.0) == pytest.approx(0.5)
    # drafting for free: tau itself while verification costs no more than a step
    assert throughput_multiplier("verify-only", TOY, None, fast, 1, 0, 3, tau=2.0) == pytest.approx(2.0)
    # compute-bound everywhere (unit hardware, L = 0): verifying k + 1 tokens costs k + 1 steps
    assert throughput_multiplier("verify-only", TOY, None, UNIT, 1, 0, 3, tau=2.0) == pytest.approx(2.0 / 4)
    assert projected_speedup(3.0, 0.012, 0.010) == pytest.approx(2.5)


def test_expected_tau():
    assert expected_tau(0.0, 4) == 1.0
    assert expected_tau(1.0, 4) == 5.0
    assert expected_tau(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    with pytest.raises(ValueError):
        expected_tau(1.5, 4)


@pytest.mark.parametrize("arch", ["llama-tied", "llama-untied", "llama-head-dim-bias", "qwen2"])
def test_parameter_count_matches_a_real_model(arch):
    kwargs = dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=120,
    )
    if arch == "qwen2":
        config = Qwen2Config(**kwargs, tie_word_embeddings=False, use_sliding_window=False)
        model = Qwen2ForCausalLM(config)
    else:
        extra = {
            "llama-tied": dict(tie_word_embeddings=True),
            "llama-untied": dict(tie_word_embeddings=False),
            "llama-head-dim-bias": dict(head_dim=16, attention_bias=True, mlp_bias=True),
        }[arch]
        config = LlamaConfig(**kwargs, **extra)
        model = LlamaForCausalLM(config)
    shape = ModelShape.from_config(config)
    assert shape.num_parameters == sum(p.numel() for p in model.parameters())
    assert ModelShape.from_config(config.to_dict()).num_parameters == shape.num_parameters  # a config.json dict too


def test_named_shapes():
    llama3 = ModelShape.from_name("llama-3-8b")
    assert llama3.num_parameters == pytest.approx(8.03e9, rel=1e-3)
    assert (llama3.kv_heads, llama3.head_dim, llama3.dtype_bytes) == (8, 128, 2)
    small = ModelShape.from_name("smollm2-135m", dtype_bytes=4)
    assert small.num_parameters == pytest.approx(134.5e6, rel=1e-2) and small.tied
    assert ModelShape.from_name("llama-3.2-1b").num_parameters == pytest.approx(1.236e9, rel=1e-2)
    assert llama3.truncated(2).layers == 2 and llama3.truncated(2).vocab == llama3.vocab
    with pytest.raises(ValueError, match="unknown shape"):
        ModelShape.from_name("gpt-5")
    assert set(SHAPES) >= {"llama-3-8b", "smollm2-135m"}


def test_fig4_trends_on_h100():
    target = ModelShape.from_name("llama-3-8b")
    h100 = HARDWARE["h100"]
    batches, contexts = [1, 4, 16, 64, 256], [256, 1024, 4096, 16384, 32768]
    vanilla = speedup_grid("vanilla", target, ModelShape.from_name("llama-3.2-1b"), h100, 4, 3.0, batches, contexts)
    for j in range(len(contexts)):  # vanilla SD falls with B at fixed L
        col = [row[j] for row in vanilla.speedup]
        assert all(b <= a + 1e-12 for a, b in zip(col, col[1:])) and col[-1] < col[0]
    for method, draft in (("spire", target.truncated(2)), ("magicdec", None)):
        grid = speedup_grid(method, target, draft, h100, 4, 3.0, batches, contexts)
        for i in (3, 4):  # a sparse draft cache: rises with L at large B
            row = grid.speedup[i]
            assert all(b >= a - 1e-12 for a, b in zip(row, row[1:])) and row[-1] > row[0]
        assert grid.speedup[-1][-1] > vanilla.speedup[-1][-1]  # and beats vanilla at large B x L
        assert grid.speedup[-1][-1] < 3.0  # never above tau
    assert speedup_grid("magicdec", target, None, h100, 4, 3.0, [1], [256]).speedup[0][0] < 1  # k target forwards
    with pytest.raises(ValueError, match="needs a draft"):
        step_times("spire", target, None, h100, 1, 256, 4)
    with pytest.raises(ValueError, match="unknown method"):
        step_times("medusa", target, None, h100, 1, 256, 4)


def test_measure_cpu_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    hw = Hardware.measure_cpu(threads=1, seconds=0.05)
    assert hw.flops > 1e8 and hw.bandwidth > 1e8 and hw.meta["threads"] == 1
    assert list((tmp_path / "hardware").glob("cpu-*.json"))
    monkeypatch.setattr(torch, "mm", None)  # measuring again would fail: the second call reads the cache
    again = Hardware.measure_cpu(threads=1)
    assert (again.flops, again.bandwidth) == (hw.flops, hw.bandwidth)


def test_cli_writes_heatmap_and_json(tmp_path, capsys):
    png, out = tmp_path / "heat.png", tmp_path / "grid.json"
    rc = main(
        [
            "--target",
            "llama-3-8b",
            "--draft",
            "spire:2",
            "--hardware",
            "h100",
            "--k",
            "4",
            "--alpha",
            "0.8",
            "--batch-sizes",
            "1,16,256",
            "--contexts",
            "256,4096,32768",
            "--output",
            str(png),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rec = json.loads(out.read_text())
    assert rec["kind"] == "projected" and rec["tau"] == pytest.approx(expected_tau(0.8, 4))
    grid = rec["methods"]["spire"]
    assert grid["batch_sizes"] == [1, 16, 256] and grid["contexts"] == [256, 4096, 32768]
    assert len(grid["speedup"]) == 3 and all(len(r) == 3 for r in grid["speedup"])
    text = capsys.readouterr().out
    assert "projected throughput multiplier, spire" in text and "B \\ L" in text


def test_cli_all_methods_and_config_paths(tmp_path, capsys):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text(json.dumps({**SHAPES["tiny"], "model_type": "llama"}))
    out = tmp_path / "all.json"
    rc = main(
        [
            "--target",
            "reference",
            "--draft",
            str(tmp_path / "draft"),
            "--method",
            "all",
            "--hardware",
            "a100",
            "--tau",
            "2.5",
            "--batch-sizes",
            "1,8",
            "--contexts",
            "512",
            "--output",
            str(tmp_path / "h.png"),
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    assert set(json.loads(out.read_text())["methods"]) == {"vanilla", "magicdec", "spire"}
    assert all((tmp_path / f"h_{m}.png").stat().st_size > 0 for m in ("vanilla", "magicdec", "spire"))
    with pytest.raises(ValueError, match="needs --draft"):
        main(["--method", "vanilla", "--tau", "2"])
