"""``hf-speculative train`` under ``accelerate launch`` with 2 CPU processes (DDP over gloo, through the Trainer):
a tiny Medusa drafter trains for a few steps and one checkpoint is saved that loads and drafts exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import hf_speculative as hfs

from conftest import tiny_chat_model

ROOT = Path(__file__).resolve().parents[1]


def test_two_process_medusa_training(tmp_path):
    model, tok = tiny_chat_model(2)
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    with open(tmp_path / "data.jsonl", "w") as f:
        for i in range(8):
            msgs = [{"role": "user", "content": f"count {i}"}, {"role": "assistant", "content": "one two three four five six"}]
            f.write(json.dumps({"id": str(i), "messages": msgs}) + "\n")
    # accelerate's multi-process launcher (torch.distributed.run underneath); without CUDA the Trainer uses gloo
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]  # fmt: skip
    train = ["-m", "hf_speculative.cli", "train", "medusa", "--model", str(tmp_path / "base"), "--data", str(tmp_path / "data.jsonl"),
             "--out", str(tmp_path / "out"), "--num-heads", "2", "--epochs", "2", "--batch-size", "8", "--holdout", "0.25",
             "--calibrate-nodes", "4", "--threads", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_SPECULATIVE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    out = subprocess.run(launch + train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
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
