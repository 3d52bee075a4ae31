"""Model-card text every drafter's card shares, and the end of every ``train`` command (a Hub-ready folder)."""

from __future__ import annotations

__all__ = ["curve_and_command_lines", "finish_folder"]


def curve_and_command_lines(training: dict, title: str, header: str, x_key: str, accuracy_key: str) -> list[str]:
    """Markdown lines for a card's training section: the learning-curve table (``header`` names its three
    columns: training seen, held-out accuracy, expected tau) and the command that made the checkpoint."""
    lines = []
    curve = training.get("learning_curve")
    if curve:
        lines.append(f"- learning curve ({title}):\n")
        lines.append(f"| {header} |\n|---:|---|---:|")
        for pt in curve:
            lines.append(f"| {pt[x_key]} | {pt[accuracy_key]} | {pt['expected_tau_calibrated']} |")
        lines.append("")
    if training.get("command"):
        lines.append(f"- command:\n\n```bash\n{training['command']}\n```")
    return lines


def finish_folder(out, save, write_card, report: dict) -> int:
    """End of a ``train`` command: ``save(out)`` (weights + config), ``write_card(out)`` (None: no card), drop the
    Trainer's scratch folder ``out/trainer_state`` and print ``report`` as JSON; returns the exit code 0."""
    import json
    import shutil
    from pathlib import Path

    out = Path(out)
    save(out)
    if write_card is not None:
        write_card(out)
    shutil.rmtree(out / "trainer_state", ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0
