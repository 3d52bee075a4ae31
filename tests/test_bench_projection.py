"""Projected GPU speedup: the arithmetic, the CPU code path on a tiny shape, and the CUDA requirement."""

import json

import pytest
import torch

from hf_speculative.bench.projection import SHAPES, measure_step_latency, project, projected_speedup, shape_config
from hf_speculative.cli import main


def test_projected_speedup_arithmetic():
    assert projected_speedup(3.0, t_tree=0.012, t_one=0.010) == pytest.approx(2.5)
    assert projected_speedup(2.0, t_tree=0.010, t_one=0.010) == pytest.approx(2.0)
    assert projected_speedup(3.0, t_tree=0.010, t_one=0.010, draft_time=0.005) == pytest.approx(2.0)
    for bad in ((0, 1, 1), (2, 0, 1), (2, 1, 0)):
        with pytest.raises(ValueError):
            projected_speedup(*bad)


def test_shapes():
    cfg = shape_config("llama-2-7b")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (4096, 32, 32000)
    assert "smollm2-135m" in SHAPES
    with pytest.raises(ValueError):
        shape_config("gpt-5")


def test_measure_on_cpu_tiny_shape():
    import hf_speculative as hfs

    torch.set_num_threads(1)
    tree = hfs.TreeSpec.cartesian([2, 2])
    t = measure_step_latency("tiny", tree=tree, prefix_len=16, dtype=torch.float32, device="cpu", iters=2, warmup=1)
    assert t.n_tokens == 7 and t.t_one > 0 and t.t_tree > 0
    rec = project(2.0, t)
    assert rec["kind"] == "projected"
    assert rec["projected_speedup"] == pytest.approx(2.0 / t.step_overhead)
    t2 = measure_step_latency("tiny", n_tokens=4, prefix_len=8, dtype=torch.float32, device="cpu", iters=1, warmup=0)
    assert t2.n_tokens == 4


def test_cli_says_it_needs_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["project", "--shape", "llama-2-7b", "--tau", "2.5"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="CUDA"):
        measure_step_latency("tiny", n_tokens=2, device="cuda")


def test_cli_tau_from_bench_json(tmp_path, capsys):
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps({"methods": {"tree-layercut": {"tau": 2.0}}}))
    out = tmp_path / "p.json"
    rc = main(
        [
            "project",
            "--shape",
            "tiny",
            "--bench-json",
            str(bench),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--iters",
            "1",
            "--prefix-len",
            "8",
            "--tree",
            "cartesian:2",
            "--output",
            str(out),
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["kind"] == "projected" and rec["tau_measured"] == 2.0 and rec["n_tokens"] == 3
    assert "(projected)" in capsys.readouterr().out
