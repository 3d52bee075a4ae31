#!/usr/bin/env bash
# Speculative Streaming's Table 1 setting on SmolLM2-135M-Instruct: every arm trained with one LoRA setup and one
# wall-time budget per arm and task (BUDGET seconds; E2E NLG first, then WikiSQL, then DialogSum), then evaluated plain against
# speculative on the test prompts, and gathered into docs/downstream_table.md + docs/downstream.png.
#
#   DATA=../shared/data BUDGET=180 bash benchmarks/downstream_table1.sh            # a GPU: train + eval
#   STAGE=eval THREADS=2 LIMIT=50 bash benchmarks/downstream_table1.sh              # eval only (this CPU)
#
# Training on a 2-core CPU is slow: keep it to GPUs, or give each arm an hour (BUDGET=3600) and run in the
# background; an interrupted run continues with the same command plus --resume.
set -euo pipefail
export HF_HUB_OFFLINE=1
HERE="$(cd "$(dirname "$0")" && pwd)"
DATA=${DATA:-../shared/data}
BUDGET=${BUDGET:-180}
STAGE=${STAGE:-all}
THREADS=${THREADS:-2}
LIMIT=${LIMIT:-50}
BATCH=${BATCH:-16}
RESULTS=${RESULTS:-docs/results/downstream}
ARMS=(
  "e2e_nlg lora" "e2e_nlg streaming" "e2e_nlg medusa2" "e2e_nlg eagle"
  "wikisql lora" "wikisql streaming" "wikisql medusa2"
  "dialogsum lora" "dialogsum streaming"
)
folder() {  # model_cards/<arm>-smollm2-135m-<task>
  local task=${1//_/-} prefix
  case $2 in
    lora) prefix=lora ;; streaming) prefix=speculative-streaming ;; medusa2) prefix=medusa2 ;; eagle) prefix=eagle3 ;;
  esac
  echo "model_cards/${prefix}-smollm2-135m-${task}"
}
for arm in "${ARMS[@]}"; do
  read -r task method <<<"$arm"
  dir=${task}; out=$(folder "$task" "$method")
  if [[ $STAGE != eval ]]; then
    extra=()
    [[ $method == eagle ]] && extra=(--adapter "$(folder "$task" lora)")
    batch=$BATCH  # DialogSum's joint forward (1,024-token segments x 4 streams) needs > 24 GB at batch 8: STREAM_BATCH=2 there
    [[ $task == dialogsum && $method == streaming ]] && batch=${STREAM_BATCH:-$BATCH}
    python "$HERE/run_downstream.py" train --task "$task" --method "$method" --data "$DATA/$dir" --out "$out" \
      --time-budget "$BUDGET" --epochs 100 --batch-size "$batch" "${extra[@]}"
  fi
  if [[ $STAGE != train ]]; then
    python "$HERE/run_downstream.py" eval "$out" --task "$task" --data "$DATA/$dir" --limit "$LIMIT" --threads "$THREADS" \
      --output "$RESULTS/${task}_${method}.json"
  fi
done
[[ $STAGE != train ]] && python "$HERE/run_downstream.py" table --results "$RESULTS" --output docs/downstream_table.md --plot docs/downstream.png
