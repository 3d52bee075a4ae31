"""``hf-speculative train`` and ``downstream train`` under ``accelerate launch`` with 2 CPU processes (DDP over gloo,
through the Trainer): a tiny Medusa drafter trains for a few steps and one checkpoint is saved that loads and drafts
exactly; the LoRA and shared-mode Speculative Streaming arms train under a time budget, both processes stop at the
same step and end with the same weights (the base's LoRA weights are outside DDP in shared mode), and the folder
decodes losslessly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import saved_chat_model_and_data, tiny_chat_model

import hf_speculative as hfs

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


# accelerate's multi-process launcher (torch.distributed.run underneath); without CUDA the Trainer uses gloo
LAUNCH = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--multi_gpu",
    "--num_processes",
    "2",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
    "--main_process_port",
    "0",
]


def _env(tmp_path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_SPECULATIVE_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }


def test_two_process_medusa_training(tmp_path):
    model, _, _, _ = saved_chat_model_and_data(tmp_path, num_layers=2)
    train = [
        "-m",
        "hf_speculative.cli",
        "train",
        "medusa",
        "--model",
        str(tmp_path / "base"),
        "--data",
        str(tmp_path / "data.jsonl"),
        "--out",
        str(tmp_path / "out"),
        "--num-heads",
        "2",
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--holdout",
        "0.25",
        "--calibrate-nodes",
        "4",
        "--threads",
        "1",
    ]
    out = subprocess.run(LAUNCH + train, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count('"method": "medusa-1 (frozen backbone)"') == 1  # only the main process reports and saves
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["training"]["processes"] == 2 and config["training"]["conversations"] == 6
    assert not (tmp_path / "out" / "trainer_state").exists()

    target = hfs.enable(model)
    heads = hfs.MedusaHeadsModel.from_pretrained(tmp_path / "out", base_model=target)
    assert heads.config.num_heads == 2 and len(heads.config.medusa_choices) == 4
    ids = torch.tensor([[3, 5, 7, 9]])
    plain = target.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(ids, assistant_model=heads, max_new_tokens=12, do_sample=False), plain)


@pytest.mark.parametrize("method", ["lora", "streaming"])
def test_two_process_downstream_training(tmp_path, method):
    from downstream.cli import main

    model, tok = tiny_chat_model(4)
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    data = tmp_path / "e2e"
    data.mkdir()
    answers = [
        "the cat sat on the mat .",
        "a big red dog is good .",
        "you tell me a short story .",
        "i run and jump in the world .",
    ]
    for name, n in (("devset.csv", 12), ("testset_w_refs.csv", 2)):  # different examples: each process sees others
        rows = ["mr,ref"] + [f'"name[{answers[(i + 1) % 4].split()[1]}], food[red]",{answers[i % 4]}' for i in range(n)]
        (data / name).write_text("\n".join(rows) + "\n")
    out = tmp_path / method
    train = [
        str(BENCHMARKS / "run_downstream.py"),
        "train",
        "--task",
        "e2e_nlg",
        "--method",
        method,
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        str(tmp_path / "base"),
        "--batch-size",
        "4",
        "--lr",
        "3e-2",
        "--calibration-prompts",
        "1",
        "--num-msa-layers",
        "2",
        "--tree-nodes",
        "4",
        "--max-steps",
        "100000",
        "--time-budget",
        "4",
        "--threads",
        "1",
        "--no-progress",
    ]
    run = subprocess.run(LAUNCH + train, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count('"method": "%s"' % method) == 1  # only the main process reports and writes
    training = json.loads((out / "downstream.json").read_text())["training"]
    assert training["processes"] == 2 and training["processes_in_sync"] is True and training["steps"] >= 1
    assert training["settings"]["batch_size"] == 4  # examples per optimizer step, 2 per process
    assert not (out / "trainer_state").exists()
    result = tmp_path / "eval.json"
    argv = [
        "eval",
        str(out),
        "--task",
        "e2e_nlg",
        "--data",
        str(data),
        "--limit",
        "2",
        "--max-new-tokens",
        "10",
        "--output",
        str(result),
        "--no-progress",
    ]
    assert main(argv) == 0
    assert json.loads(result.read_text())["lossless_rate"] == 1.0
