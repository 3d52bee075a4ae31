#!/usr/bin/env bash
# What a step costs here, before and after the engine's kernels, and what it buys: the kernel table, the cost curves
# (torch's kernels, then the engine's), and every model-free drafter beside plain generate() and transformers' prompt
# lookup on the held-out prompts and MT-Bench, in float32 and bfloat16 (one run per set, alternating per prompt,
# nothing else on the machine). Writes docs/results/<date>-step-cost-*.json and the kernel table.
#   bash scripts/bench_step_cost.sh [DATE]
set -euo pipefail
DATE=${1:-$(date -u +%F)}
OUT=docs/results
TR=model_cards/token-recycling-smollm2-135m-instruct
MEDUSA=model_cards/medusa-smollm2-135m-instruct
export HF_HUB_OFFLINE=1
{ lscpu | grep -E "Model name|^CPU\(s\)"; echo "flags: $(grep -o -w -E 'avx2|fma|avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"; } > "$OUT/$DATE-step-cost-machine.txt"
# 1. the kernel table (rows x kernel, ms for the model's linear layers) and the cost curves, per dtype
python scripts/kernel_table.py --threads 2 --output "$OUT/$DATE-step-cost-kernels.json"
for DT in float32 bfloat16; do
  hf-speculative calibrate --model reference --threads 2 --dtype $DT --kernels torch --force | tail -1 > "$OUT/$DATE-step-cost-curve-$DT-torch.json"
  hf-speculative calibrate --model reference --threads 2 --dtype $DT --force | tail -1 > "$OUT/$DATE-step-cost-curve-$DT-engine.json"
done
METHODS=plain,hf-prompt-lookup,tree-prompt-lookup,token-recycling,medusa,hybrid:pl+tr,hybrid
# 2. held-out task prompts (8, two per category) and MT-Bench (one per category), float32 then bfloat16
for DT in float32 bfloat16; do
  FLOOR=$([ $DT = float32 ] && echo --no-numerics-floor || true)
  hf-speculative bench --model reference --threads 2 --dtype $DT --prompts heldout --limit 8 --max-new-tokens 96 $FLOOR \
    --methods "$METHODS" --drafter medusa="$MEDUSA" --recycling "$TR" --output "$OUT/$DATE-step-cost-heldout-$DT.json"
  hf-speculative bench --model reference --threads 2 --dtype $DT --prompts mt_bench --per-category 1 --max-new-tokens 96 $FLOOR \
    --methods "$METHODS" --drafter medusa="$MEDUSA" --recycling "$TR" --output "$OUT/$DATE-step-cost-mtbench-$DT.json"
done
