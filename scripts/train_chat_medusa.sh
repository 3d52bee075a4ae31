#!/usr/bin/env bash
# Generic-chat Medusa-1 heads for SmolLM2-135M-Instruct on the labels scripts/train_chat_eagle3.sh made (its
# self-distilled answers and ShareGPT's own answers, up to 2M tokens; the final state and top-20 log-probabilities are
# in them), by distillation (KL against the target's stored top-k). Run it after that script's labelling; rerun after a
# kill: it resumes from $OUT/trainer_state.
#
#   bash scripts/train_chat_medusa.sh            # from the repository root
#
# Settings (environment): OUT, LABELS, TRAIN_BUDGET (3,600 s of running time), HEADS (4), DRAFT_VOCAB (16,384),
# BATCH (256 positions per step: the heads train on single positions, and a step of a few positions is mostly
# overhead), THREADS.
set -euo pipefail
OUT=${OUT:-outputs/train/chat-medusa}
LABELS=${LABELS:-${HF_SPECULATIVE_CACHE:-$HOME/.cache/hf_speculative}/labelled}
TRAIN_BUDGET=${TRAIN_BUDGET:-3600}
HEADS=${HEADS:-4}
DRAFT_VOCAB=${DRAFT_VOCAB:-16384}
BATCH=${BATCH:-256}
THREADS=${THREADS:-2}
python -m hf_speculative.cli train medusa --model reference --labelled "$LABELS/chat-self" \
    --labelled "$LABELS/chat-sharegpt" --labelled-holdout 100 --out "$OUT" --num-heads "$HEADS" \
    --draft-vocab-size "$DRAFT_VOCAB" --calibrate-nodes 16 --epochs 100 --batch-size "$BATCH" --save-steps 50 \
    --time-budget "$TRAIN_BUDGET" --threads "$THREADS"
