"""Model-card text every drafter's card shares."""

from __future__ import annotations

__all__ = ["curve_and_command_lines"]


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
