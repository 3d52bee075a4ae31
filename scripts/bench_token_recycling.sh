#!/usr/bin/env bash
# Token Recycling and hybrid trees on the reference model, every method in one run per prompt set, alternating per
# prompt, on an otherwise idle machine. Writes docs/results/2026-11-25-token-recycling-*.json.
#   bash scripts/bench_token_recycling.sh
set -euo pipefail
OUT=docs/results
MEDUSA=model_cards/medusa-smollm2-135m-instruct
TR=model_cards/token-recycling-smollm2-135m-instruct
export HF_HUB_OFFLINE=1
# 1. the machine's cost curves (what a tree step costs here), cached; every cost-aware tree reads them
hf-speculative calibrate --model reference --threads 2
hf-speculative calibrate --model reference --threads 2 --dtype bfloat16
# 2. the shipped warm matrix: ShareGPT prompts (never benchmarked), greedy decoding
hf-speculative warm-recycling --model reference --threads 2 \
  --prompts ../shared/data/sharegpt/ShareGPT_V3_filtered_1000.json --limit 40 --max-new-tokens 96 --out "$TR"
METHODS=plain,hf-prompt-lookup,tree-prompt-lookup,token-recycling,medusa,hybrid:pl+tr,hybrid:pl+medusa,hybrid:tr+medusa,hybrid
# 3. fp32: held-out task prompts (8, round robin over the 4 categories) and MT-Bench (one per category)
hf-speculative bench --model reference --threads 2 --prompts heldout --limit 8 --max-new-tokens 96 --no-numerics-floor \
  --methods "$METHODS" --drafter medusa="$MEDUSA" --recycling "$TR" --output $OUT/2026-11-25-token-recycling-heldout-fp32.json.gz
hf-speculative bench --model reference --threads 2 --prompts mt_bench --per-category 1 --max-new-tokens 96 --no-numerics-floor \
  --methods "$METHODS" --drafter medusa="$MEDUSA" --recycling "$TR" --output $OUT/2026-11-25-token-recycling-mtbench-fp32.json.gz
# 4. bf16: the same held-out prompts (identical-output rate against plain bf16 and the numerics floor)
hf-speculative bench --model reference --threads 2 --dtype bfloat16 --prompts heldout --limit 8 --max-new-tokens 96 \
  --methods plain,hf-prompt-lookup,tree-prompt-lookup,token-recycling,hybrid:pl+tr --recycling "$TR" \
  --output $OUT/2026-11-25-token-recycling-heldout-bf16.json
