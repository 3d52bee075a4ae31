#!/usr/bin/env bash
# Speculative Streaming ablation on the reference target: gamma (streams) and N_s (MSA layers) at one SHORT
# training budget each (STEPS steps of 2 segments of 256 tokens), calibrated 16-node trees, then tau and speed
# of every variant against plain greedy in one process (scripts/drafter_table.py, 8 MT-Bench prompts), with
# parallel tree pruning (Sec. 3.1.3) on and off for the reference streams (see train streaming-pruning).
set -euo pipefail
export HF_HUB_OFFLINE=1
DATA=${DATA:-examples/data/sharegpt_smollm2_distill.jsonl}
STEPS=${STEPS:-80}
LOCK="flock /tmp/hfs-heavy.lock nice -n 5"
for V in ${VARIANTS:-3x4 2x4 4x4 3x2}; do
  G=${V%x*}; N=${V#*x}
  $LOCK hf-speculative train streaming --model reference --threads 2 --data "$DATA" --out outputs/streaming_g${G}_n${N} \
    --num-streams "$G" --num-msa-layers "$N" --max-length 768 --holdout 0.1 --epochs 1 --lr 3e-3 --batch-size 2 \
    --segment-length 256 --max-steps "$STEPS" --time-budget 400 --calibrate-nodes 16 > outputs/streaming_g${G}_n${N}.log 2>&1
done
FOLDERS=""
for V in ${VARIANTS:-3x4 2x4 4x4 3x2}; do FOLDERS="$FOLDERS outputs/streaming_g${V%x*}_n${V#*x}"; done
$LOCK python scripts/drafter_table.py $FOLDERS ${PRUNED:-outputs/streaming_pruned_l20} --pruning-thresholds "${THRESHOLDS:-0,0.005,0.02}" \
  --per-category 1 --threads 2 --out outputs/streaming_ablation.json
