#!/usr/bin/env bash
# Generic-chat EAGLE-3 for SmolLM2-135M-Instruct, from nothing to a trained folder, unattended for hours.
#
#   bash scripts/train_chat_eagle3.sh            # from the repository root; rerun it after a kill: it resumes
#
# Steps, each of which resumes from what it finds on disk (and says so):
#   1. self-distillation: the target's greedy answers to the first turns of ShareGPT's training conversations,
#      batched through the engine with SuffixDecoding, for DISTILL_BUDGET seconds in all (a rerun distills only for
#      what is left: the seconds spent are kept in $OUT/distill_seconds);
#   2. labelling those answers with the target (hidden states of layers 2, 15, 27 and the final one, top-20
#      log-probs), cached in $LABELS/chat-self;
#   3. labelling ShareGPT's own answers until both folders hold TOKENS tokens, cached in $LABELS/chat-sharegpt;
#   4. training EAGLE-3 on both folders (their last 100 conversations held out each) for TRAIN_BUDGET seconds in all
#      (as many epochs as fit), checkpointing every 50 steps into $OUT/trainer_state, its curve redrawn there as a
#      plot; then its tree calibrated on 40 held-out conversations of each folder.
# Settings (environment): OUT, LABELS, DISTILL_BUDGET (2400 s), TOKENS (2,000,000), TRAIN_BUDGET (10,800 s),
# DRAFT_VOCAB (4096), THREADS (2), AUTOCAST (empty: float32 labels; bfloat16 where the CPU has native bf16 products,
# about twice as fast). Run it at low priority beside other work (nice -n 19) and stop it (kill -STOP)
# while anything is timed.
set -euo pipefail
OUT=${OUT:-outputs/train/chat-eagle3}
LABELS=${LABELS:-${HF_SPECULATIVE_CACHE:-$HOME/.cache/hf_speculative}/labelled}
DISTILL_BUDGET=${DISTILL_BUDGET:-2400}
TOKENS=${TOKENS:-2000000}
TRAIN_BUDGET=${TRAIN_BUDGET:-10800}
DRAFT_VOCAB=${DRAFT_VOCAB:-4096}
THREADS=${THREADS:-2}
AUTOCAST=${AUTOCAST:-}
HFS="python -m hf_speculative.cli"
mkdir -p "$OUT" "$LABELS"

spent=$(cat "$OUT/distill_seconds" 2>/dev/null || echo 0)
left=$((DISTILL_BUDGET - spent))
if [ "$left" -gt 60 ]; then
    echo "== 1. self-distillation: ${spent} s spent, ${left} s left"
    start=$SECONDS
    $HFS distill --model reference --prompts sharegpt --out "$OUT/self_distilled.jsonl" --batch-size 8 \
        --drafter suffix --sort-window 256 --max-prompt-tokens 512 --max-new-tokens 256 \
        --time-budget "$left" --threads "$THREADS"
    echo $((spent + SECONDS - start)) > "$OUT/distill_seconds"
else
    echo "== 1. self-distillation: done ($spent s spent; $(wc -l < "$OUT/self_distilled.jsonl") answers)"
fi

echo "== 2. labelling the self-distilled answers"
$HFS label --model reference --data "$OUT/self_distilled.jsonl" --output "$LABELS/chat-self" \
    --layers 2 15 27 -1 --threads "$THREADS" ${AUTOCAST:+--autocast "$AUTOCAST"}
self=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['total_tokens'])" "$LABELS/chat-self/manifest.json")

echo "== 3. labelling ShareGPT's own answers: $self self-distilled tokens, up to $TOKENS in all"
$HFS label --model reference --data sharegpt --output "$LABELS/chat-sharegpt" --max-tokens $((TOKENS - self)) \
    --layers 2 15 27 -1 --threads "$THREADS" ${AUTOCAST:+--autocast "$AUTOCAST"}

echo "== 4. training EAGLE-3 (resumes from $OUT/trainer_state)"
$HFS train eagle --model reference --variant eagle3 --labelled "$LABELS/chat-self" --labelled "$LABELS/chat-sharegpt" \
    --labelled-holdout 100 --out "$OUT/drafter" --draft-vocab-size "$DRAFT_VOCAB" --ttt-steps 4 \
    --max-length 512 --batch-size 8 --lr 1e-3 --epochs 100 --save-steps 50 --time-budget "$TRAIN_BUDGET" \
    --threads "$THREADS"
