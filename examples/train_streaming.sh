#!/usr/bin/env bash
# Speculative Streaming reference streams for SmolLM2-135M-Instruct (lossless mode, CPU).
# Step 1 runs the frozen base once over the data up to layer N - N_s and caches those states (fp16,
# ~/.cache/hf_speculative/stream_inputs/); step 2 trains only the streams on the top N_s layers.
# On a shared machine run each step under the heavy-job lock: flock /tmp/hfs-heavy.lock nice -n 5 ...
set -euo pipefail
export HF_HUB_OFFLINE=1
DATA=examples/data/sharegpt_smollm2_distill.jsonl
OUT=model_cards/speculative-streaming-smollm2-135m-instruct
COMMON=(--model reference --data "$DATA" --num-streams 3 --num-msa-layers 4 --max-length 768 --threads 2 --holdout 0.1)
hf-speculative train streaming "${COMMON[@]}" --out "$OUT" --extract-only
hf-speculative train streaming "${COMMON[@]}" --out "$OUT" --epochs 1 --lr 3e-3 --batch-size 2 --segment-length 256 \
    --time-budget 600 --calibrate-nodes 16 --curve-points 4
