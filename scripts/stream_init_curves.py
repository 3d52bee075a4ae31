"""Speculative Streaming's stream embeddings started at random against from the token embeddings: both runs' training
losses per stream and held-out top-1 per stream, side by side.

    L=~/.cache/hf_speculative/labelled/chat-self
    for init in random token_embeddings; do
      hf-speculative train streaming --model reference --mode lossless --labelled $L --labelled-holdout 40 \
        --num-msa-layers 3 --num-streams 3 --stream-embedding-init $init --max-steps 40 --batch-size 4 \
        --segment-length 256 --draft-vocab-size 4096 --curve-points 4 --calibrate-nodes 16 --lr 1e-3 --save-steps 0 \
        --threads 2 --seed 0 --out outputs/train/ss-init-$init > outputs/train/ss-init-$init.log 2>&1
    done
    python scripts/stream_init_curves.py outputs/train/ss-init-random outputs/train/ss-init-token_embeddings \
        --plot docs/results/stream-init.png

Each FOLDER is a ``train streaming`` output folder with its log beside it (``FOLDER.log``, the command's output): the
losses come from the log's logged dicts, the held-out curve from ``config.json``'s ``training.learning_curve``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

LOGGED = re.compile(r"\{'loss': [^}]*\}")


def logged_losses(log: Path) -> list[dict]:
    """The Trainer's logged dicts (``{'loss': ..., 'loss_stream1': ..., 'epoch': ...}``) in a command's output."""
    text = log.read_text(errors="replace")
    return [{k: float(v) for k, v in ast.literal_eval(m).items()} for m in LOGGED.findall(text)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--plot", required=True)
    args = ap.parse_args()
    from matplotlib.figure import Figure

    from hf_speculative.plotting import save_figure

    fig = Figure(figsize=(11, 4))
    loss_ax, top1_ax = fig.subplots(1, 2)
    for folder, style in zip(args.folders, ("-", "--", ":")):
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        training, init = config["training"], config.get("stream_embedding_init", folder.name)
        logs = logged_losses(folder.with_suffix(".log"))
        step_per_log = training["steps_done"] / max(1, len(logs))
        streams = sorted(k for k in logs[0] if k.startswith("loss_stream"))
        for j, key in enumerate(streams):
            steps = [round((i + 1) * step_per_log) for i in range(len(logs))]
            loss_ax.plot(steps, [row[key] for row in logs], style, color=f"C{j}", label=f"{init}: stream {j + 1}")
        curve = training["learning_curve"]
        for j in range(len(curve[0]["stream_top1"])):
            top1_ax.plot(
                [p["step"] for p in curve],
                [p["stream_top1"][j] for p in curve],
                style,
                color=f"C{j}",
                label=f"{init}: stream {j + 1}",
            )
        print(
            f"{init}: last losses {[logs[-1][k] for k in streams]}, held-out top-1 {curve[-1]['stream_top1']}, "
            f"expected tau {curve[-1]['expected_tau_calibrated']}, {training.get('train_seconds')} s"
        )
    loss_ax.set(xlabel="optimizer step", ylabel="stream KD loss (log scale)", yscale="log", title="training loss")
    top1_ax.set(xlabel="optimizer step", ylabel="held-out top-1", title="held-out top-1 per stream")
    loss_ax.legend(fontsize=7)
    top1_ax.legend(fontsize=7)
    print(f"wrote {save_figure(fig, args.plot)}")


if __name__ == "__main__":
    main()
