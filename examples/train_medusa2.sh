#!/usr/bin/env bash
# Medusa-2 for the reference target (SmolLM2-135M-Instruct): LoRA (r=8, attention projections) on the backbone
# trained jointly with 4 Medusa heads (warm-started from the Medusa-1 reference heads) on the model's own
# self-distilled ShareGPT answers, loss KL(p_original || p) + lambda0(t) * sum_k 0.8^k CE_k; then the
# evaluation (timing of base + adapter with and without the heads, quality change against the base model).
# CPU, 2 threads, a ~10-minute training budget (a short run: ~100 conversations of <= 384 tokens).
#
#   bash examples/train_medusa2.sh
set -euo pipefail
DATA=${DATA:-examples/data/sharegpt_smollm2_distill.jsonl}
OUT=${OUT:-model_cards/medusa2-smollm2-135m-instruct}

# --limit 192: the same conversations (and so the same held-out split) as the Medusa-1 reference heads used
# for the warm start, so the held-out numbers are clean.
nice -n 5 hf-speculative train medusa --medusa2 --model reference --threads 2 --data "$DATA" --limit 192 --holdout 0.1 \
  --out "$OUT" --init-heads model_cards/medusa-smollm2-135m-instruct \
  --lora-r 8 --lora-alpha 16 --lora-targets q_proj,k_proj,v_proj,o_proj --lr 2e-4 --heads-lr-ratio 4 \
  --lambda0 0.2 --lambda0-schedule sine --lambda0-warmup 0.3 --lm-loss kl \
  --max-length 384 --head-positions 128 --batch-size 1 --max-steps 120 --time-budget 600 --calibrate-nodes 28

# speed (MT-Bench first turns, greedy, 128 new tokens) and quality (ROUGE-L vs the base model's answers, held-out loss)
nice -n 5 python scripts/medusa2_eval.py --medusa2 "$OUT" --m1-heads model_cards/medusa-smollm2-135m-instruct \
  --threads 2 --per-category 1 --heldout 10 --out outputs/medusa2_eval.json --write-card
