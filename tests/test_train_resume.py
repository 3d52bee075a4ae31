"""A ``train`` command killed mid-run continues from its last checkpoint when run again, says so, and stops at its
step budget with the steps counted once (a tiny model, a real process, a real SIGKILL)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import saved_chat_model_and_data

from hf_speculative.training.callbacks import TimeBudgetCallback
from hf_speculative.training.trainer import last_complete_checkpoint

WAIT = 240  # seconds


def _command(base, data, out, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hf_speculative.cli",
        "train",
        "medusa",
        "--model",
        str(base),
        "--data",
        str(data),
        "--out",
        str(out),
        "--num-heads",
        "2",
        "--batch-size",
        "1",
        "--max-steps",
        str(steps),
        "--save-steps",
        "4",
        "--threads",
        "1",
        "--calibrate-nodes",
        "0",
    ]


def _steps(out) -> int:
    """The optimizer steps the finished run's record counts (the scratch checkpoints are gone by then)."""
    return json.loads((out / "config.json").read_text())["training"]["steps"]


def test_a_killed_train_command_resumes_and_stops_at_its_budget(tmp_path):
    _, _, base, data = saved_chat_model_and_data(tmp_path, num_layers=2, conversations=24)
    out = tmp_path / "heads"
    command = _command(base, data, out, steps=4000)  # tiny steps run at hundreds a second: enough to outlast the wait
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + WAIT
    while last_complete_checkpoint(out / "trainer_state") is None and time.monotonic() < deadline:
        assert first.poll() is None, first.stdout.read()
        time.sleep(0.2)
    time.sleep(1.0)  # killed somewhere later: between two checkpoints or while writing one
    first.kill()
    first.wait(WAIT)
    killed_at = int(last_complete_checkpoint(out / "trainer_state").rsplit("-", 1)[1])
    assert 4 <= killed_at < 4000
    second = subprocess.run(
        _command(base, data, out, steps=killed_at + 8), capture_output=True, text=True, timeout=WAIT
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from" in second.stderr and f"checkpoint-{killed_at}" in second.stderr
    assert _steps(out) == killed_at + 8  # the budget, counted across both runs
    assert (out / "model.safetensors").is_file()
    assert (out / "training_curve.png").is_file() and not (out / "trainer_state").exists()  # the curve stays
    restarted = subprocess.run(
        _command(base, data, tmp_path / "fresh", steps=4) + ["--restart"], capture_output=True, text=True, timeout=WAIT
    )
    assert restarted.returncode == 0 and "resuming from" not in restarted.stderr  # the negative control


def test_a_resumed_runs_seconds_count_the_runs_it_resumed_from(monkeypatch):
    """The seconds a training record gives (`timed_training`) add those the checkpoint it resumed from had spent (the
    time budget's `spent`): a run stopped and resumed reports its whole training time, not its last stretch."""
    from types import SimpleNamespace

    from hf_speculative.commands import common

    monkeypatch.setattr(common, "training_args", lambda args: {})
    budget = TimeBudgetCallback(3600.0, spent=120.0)
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[budget]))
    _, seconds = common.timed_training(lambda drafter, states: trainer, None, None, None)
    assert 120.0 <= seconds < 130.0
    _, alone = common.timed_training(
        lambda drafter, states: SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[])), None, None, None
    )
    assert 0.0 <= alone < 10.0


def test_a_checkpoint_cut_before_its_time_budget_file_is_not_resumed_from(tmp_path):
    """A kill can land after the Trainer wrote a checkpoint and before the time budget wrote its seconds into it:
    once the run's checkpoints carry that file, one without it is skipped, so the resumed run counts the seconds
    already spent (a run with no time budget, whose checkpoints never have it, resumes from its newest one)."""
    for step, seconds in ((4, 30.0), (8, None)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        (folder / "trainable.safetensors").write_bytes(b"weights")
        if seconds is not None:
            (folder / TimeBudgetCallback.FILE).write_text(json.dumps({"seconds": seconds}))
    marker = TimeBudgetCallback.FILE
    assert last_complete_checkpoint(tmp_path, marker) == str(tmp_path / "checkpoint-4")
    assert TimeBudgetCallback.spent_in(last_complete_checkpoint(tmp_path, marker)) == 30.0
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-8")
    (tmp_path / "checkpoint-4" / marker).unlink()  # no checkpoint has it: not a budgeted run
    assert last_complete_checkpoint(tmp_path, marker) == str(tmp_path / "checkpoint-8")


def test_training_curve_series_and_plot(tmp_path):
    from hf_speculative.training.curve_plot import curve_series, plot_training_curve

    log = [
        {"loss": 5.0, "kd_0": 2.0, "acc_0": 0.1, "acc_1": 0.05, "learning_rate": 1e-3, "step": 10},
        {"eval_loss": 4.0, "step": 10},
        {"loss": 3.0, "kd_0": 1.0, "acc_0": 0.4, "acc_1": 0.3, "loss_stream1": 7.0, "learning_rate": 9e-4, "step": 20},
        {"train_loss": 4.0, "step": 20},
    ]
    series = curve_series(log)
    assert series == {
        "loss": [(10, 5.0), (20, 3.0)],
        "kd_0": [(10, 2.0), (20, 1.0)],
        "acc_0": [(10, 0.1), (20, 0.4)],
        "acc_1": [(10, 0.05), (20, 0.3)],
        "loss_stream1": [(20, 7.0)],
    }
    path = plot_training_curve(log, tmp_path / "curve.png")
    assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_training_curve([{"train_loss": 1.0, "step": 3}], tmp_path / "none.png") is None  # nothing logged
