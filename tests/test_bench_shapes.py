"""``hf-speculative bench --shapes``: random-weight targets of published shapes (no download, no network). The real
shapes are only built on the meta device here; the measurement runs end to end on ``tiny``."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from hf_speculative.bench import shapes as shape_models
from hf_speculative.bench.shape_bench import CPU_FLAGS, PROJECTED_TAUS, PROJECTED_TREES, TREE_NODES, run_shape_bench
from hf_speculative.cli import main
from hf_speculative.perf_model import SHAPES, ModelShape, shape_config

#: published parameter counts (the model cards') of the shapes the bench measures, and their families
PUBLISHED = {
    "qwen2.5-0.5b": ("Qwen2Config", 0.494e9),
    "llama-3.2-1b": ("LlamaConfig", 1.236e9),
    "llama-3.2-3b": ("LlamaConfig", 3.213e9),
    "mistral-7b": ("MistralConfig", 7.248e9),
    "llama-3.1-8b": ("LlamaConfig", 8.030e9),
}


def _meta_model(name: str):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(shape_config(name))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shape_table_builds_each_family_in_its_own_config_class(name):
    config_class, parameters = PUBLISHED[name]
    assert type(shape_config(name)).__name__ == config_class
    model = _meta_model(name)  # no memory
    counted = sum(p.numel() for p in model.parameters())
    assert counted == ModelShape.from_name(name).num_parameters == pytest.approx(parameters, rel=2e-3)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == SHAPES[name].get("tie_word_embeddings", False)
    assert (model.model.layers[0].self_attn.q_proj.bias is not None) == (name == "qwen2.5-0.5b")  # Qwen2: q/k/v biases


def test_unknown_shape_lists_the_known_ones(capsys):
    with pytest.raises(ValueError, match="unknown shape 'gpt-5'; known: .*llama-3.1-8b.*qwen2.5-0.5b"):
        shape_models.check_shape("gpt-5", "bfloat16")
    assert main(["bench", "--shapes", "tiny,gpt-5", "--threads", "1"]) == 2
    assert "unknown shape 'gpt-5'; known:" in capsys.readouterr().err


def test_float32_above_3b_and_other_dtypes_are_refused():
    with pytest.raises(ValueError, match=r"8.03B parameters: float32 is built up to 3B .*--dtype bfloat16"):
        shape_models.check_shape("llama-3.1-8b", "float32")
    with pytest.raises(ValueError, match="use one of float32, bfloat16"):
        shape_models.check_shape("tiny", "float16")
    assert shape_models.check_shape("llama-3.2-1b", "float32").dtype_bytes == 4  # allowed: 1.24B parameters


def test_a_shape_larger_than_available_memory_is_refused_before_allocating(monkeypatch):
    """With 2 GiB available, a 1B model in bfloat16 (2.3 GiB of weights) is refused with the numbers, before any
    model is built, also when a shape that fits comes first in the list."""
    monkeypatch.setattr(shape_models, "available_memory", lambda: 2 << 30)
    monkeypatch.setattr(shape_models, "_materialize", lambda *a: pytest.fail("allocated"))
    monkeypatch.setattr("hf_speculative.bench.shape_bench.measure_shape", lambda *a, **k: pytest.fail("measured"))
    message = r"llama-3.2-1b in bfloat16 needs \d+\.\d GiB \(1.24B parameters x 2 bytes = 2.3 GiB of weights.* 2.0 GiB available"
    with pytest.raises(ValueError, match=message):
        run_shape_bench(["tiny", "llama-3.2-1b"], ["bfloat16"], memory=False)
    with pytest.raises(ValueError, match="nothing was allocated"):
        shape_models.build_shape_model("llama-3.2-1b", "bfloat16")
    assert shape_models.check_shape("tiny", "bfloat16").num_parameters < 1e6  # a small shape still fits


def test_random_weights_are_made_in_place_in_the_target_dtype(monkeypatch):
    """A tied Qwen2-family shape in bfloat16: every parameter bfloat16 on the CPU, the tied head one tensor, q/k/v
    biases, norms 1, the rest std ~0.02, the rotary frequencies computed, and generate() gives its tokens."""
    tiny_qwen = dict(SHAPES["tiny"], model_type="qwen2", tie_word_embeddings=True, use_sliding_window=False)
    monkeypatch.setitem(SHAPES, "tiny-qwen2", tiny_qwen)
    model = shape_models.build_shape_model("tiny-qwen2", "bfloat16")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert {(p.dtype, p.device.type) for p in model.parameters()} == {(torch.bfloat16, "cpu")}
    assert (
        model.lm_head.weight is model.model.embed_tokens.weight
        and model.model.layers[0].self_attn.k_proj.bias is not None
    )
    assert torch.all(model.model.norm.weight == 1)
    assert model.model.layers[0].mlp.up_proj.weight.float().std().item() == pytest.approx(0.02, rel=0.1)
    assert not any(b.is_meta for b in model.buffers()) and model.model.rotary_emb.inv_freq[0] == 1.0
    ids = shape_models.random_prompt(model.config.vocab_size, 8)
    assert model.generate(ids, max_new_tokens=5, do_sample=False).shape == (1, 13)  # no EOS: every token made


def test_shapes_end_to_end_on_tiny(tmp_path, capsys):
    """The whole ``--shapes`` path on ``tiny`` (its two memory processes included) writes JSON, markdown and a PNG
    naming the CPU and its flags."""
    out = tmp_path / "shapes.json"
    rc = main(
        [
            "bench",
            "--shapes",
            "tiny",
            "--dtype",
            "float32",
            "--shape-tokens",
            "3",
            "--threads",
            "1",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    machine = data["setting"]["machine"]
    assert set(machine["flags"]) == set(CPU_FLAGS) and machine["cpu"]
    (r,) = data["shapes"]
    assert (r["shape"], r["dtype"], r["config_class"], r["new_tokens"]) == ("tiny", "float32", "LlamaConfig", 3)
    assert r["plain"]["tokens_per_s"] > 0 and r["plain"]["step_ms"] > 0
    assert r["engine"]["step_over_plain"] > 0 and r["engine"]["tokens_equal_plain"] is True  # float32: token-exact
    assert r["engine"]["step_over_plain"] == pytest.approx(r["engine"]["step_ms"] / r["plain"]["step_ms"])
    assert r["plain"]["call_split_step_ms"] > 0 and r["engine"]["call_split_step_over_plain"] > 0
    assert set(r["tree_cost"]["c"]) == {str(n) for n in TREE_NODES} and r["tree_cost"]["one_token_forward_ms"] > 0
    assert r["memory"]["plain_peak_bytes"] > 0 and r["memory"]["speculative_peak_bytes"] > 0
    assert isinstance(r["memory"]["first_call_overhead_s"], float) and r["memory"]["enable_s"] >= 0
    assert set(r["projected_speedup"]) == {str(n) for n in PROJECTED_TREES}
    assert all(set(by_tau) == {str(t) for t in PROJECTED_TAUS} for by_tau in r["projected_speedup"].values())
    table = out.with_suffix(".md").read_text()
    assert machine["cpu"] in table and "amx_bf16" in table and "| tiny | float32 |" in table
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| shape | dtype | parameters | plain tok/s |" in printed and f"wrote {out.with_suffix('.png')}" in printed
