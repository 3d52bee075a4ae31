#!/usr/bin/env bash
# Medusa-1 heads for the reference target (SmolLM2-135M-Instruct) on its own self-distilled ShareGPT answers,
# then the Cartesian-tree twin for the tree comparison and the benchmark. CPU, one thread (shared machine).
#
#   bash examples/train_medusa.sh            # ~5 min hidden states + ~25 min training on one core
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
DATA=${DATA:-examples/data/sharegpt_smollm2_distill.jsonl}
OUT=${OUT:-model_cards/medusa-smollm2-135m-instruct}
NODES=${NODES:-28}   # node budget of the calibrated tree; Cartesian [4,2,2] has the same 28 nodes

# 1) Medusa-1: frozen backbone, its final hidden states cached once under $HF_SPECULATIVE_CACHE,
#    4 heads x 1 ResBlock sharing the frozen lm_head; 10% of the conversations held out to calibrate the tree.
nice -n 19 hf-speculative train medusa --model reference --threads 1 --data "$DATA" --out "$OUT" \
  --num-heads 4 --num-layers 1 --epochs 2 --lr 1e-3 --batch-size 64 --holdout 0.1 \
  --calibrate-nodes "$NODES" --curve-points 5 --curve-checkpoints outputs/medusa_curve

# 2) the same heads with the Cartesian tree of the same node budget
python examples/medusa_trees.py --heads "$OUT" --cartesian 4,2,2 --out outputs/medusa-cartesian-4-2-2

# 3) benchmark: plain generate vs both trees, greedy, MT-Bench first turns, 128 new tokens
nice -n 19 hf-speculative bench --model reference --threads 1 --prompts "${PROMPTS:-mt_bench}" --max-new-tokens 128 \
  --methods plain,medusa-calibrated,medusa-cartesian \
  --drafter medusa-calibrated="$OUT" --drafter medusa-cartesian=outputs/medusa-cartesian-4-2-2 \
  --output outputs/bench_medusa.json "$@"

# 4) tau against training tokens (the checkpoints of step 1, all with the final calibrated tree)
nice -n 19 python scripts/tau_curve.py --checkpoints outputs/medusa_curve --tree-from "$OUT" --out outputs/medusa_tau_curve.json
