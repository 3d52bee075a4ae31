#!/usr/bin/env bash
# ParallelSpec drafter for the reference target (SmolLM2-135M-Instruct) on its own self-distilled ShareGPT
# answers: group-wise parallel training (k = 4 mask tokens, one decoder layer, EAGLE-style fusion of the
# target's hidden states, ParallelSpec 4.3), a calibrated 12-node tree, the model card, then the benchmark.
# CPU, 2 threads, on a machine shared with other jobs: every heavy step goes through the shared lock.
#
#   bash examples/train_parallel_drafter.sh     # ~5 min target states (cached afterwards) + 10 min training + ~5 min bench
set -euo pipefail
export HF_HUB_OFFLINE=1
DATA=${DATA:-examples/data/sharegpt_smollm2_distill.jsonl}
OUT=${OUT:-model_cards/parallel-drafter-smollm2-135m-instruct}
LOCK="flock /tmp/hfs-heavy.lock nice -n 5"

# 1) training: the target's final hidden states cached once under $HF_SPECULATIVE_CACHE; 10% of the
#    conversations held out for the tree calibration and the learning curve (checkpoints in outputs/).
$LOCK hf-speculative train parallel-drafter --model reference --threads 2 --data "$DATA" --out "$OUT" \
  --num-mask-tokens 4 --target-hidden-states --batch-size 4 --groups-per-sequence 64 --lr 1e-3 \
  --distill-weight 0.5 --max-steps 130 --time-budget 600 --holdout 0.1 --calibrate-nodes 12 \
  --curve-points 4 --curve-checkpoints outputs/parallel_curve

# 2) benchmark: plain generate vs the drafter, greedy, MT-Bench first turns, 128 new tokens
$LOCK hf-speculative bench --model reference --threads 2 --prompts mt_bench \
  --per-category "${PER_CATEGORY:-2}" --max-new-tokens 128 --methods plain,parallel-drafter \
  --drafter parallel-drafter="$OUT" --output outputs/parallel_bench.json --plot outputs/parallel_bench.png
