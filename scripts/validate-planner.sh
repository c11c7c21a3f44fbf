#!/usr/bin/env bash
# The measurements that validate the planner's steps-to-threshold predictions (issue 14), kept out
# of every fit they are judged against, and the evaluation (docs/benchmarks.md has the figures):
#
#   1. batch sweeps: rnnlm-tiny and sentiment-tiny on task data, global batch 16, 32, 64, 128, three
#      seeds each, on one worker and on two (DDP);
#   2. weak-scaling sweeps: 16 samples per worker on 1, 2 and 4 workers, three seeds each;
#
# every run under one learning-rate rule: linear scaling from lr 1e-3 at batch 16 with 20 steps of
# warm-up (what `launch sweep --mode weak` does by default), validation on the whole validation set
# every 5 steps. Then `python -m scalelab.costs.validation RUNS_DIR` fits on the small batches and predicts
# the large ones, predicts every batch from one run and its noise scale, and predicts the weak
# sweeps from the single-worker runs; it prints the errors and interval coverage as JSON, summarised
# over the independent held-out predictions only (the 2-worker runs and the weak sweeps reach the
# threshold in the 1-worker runs' steps, so they repeat predictions rather than test new ones).
#
#   scripts/validate-planner.sh [RUNS_DIR]      (default runs-validate; runs already there are kept)
#
# 66 runs of a few seconds of training each: 18 minutes on 2 shared cores, mostly start-up.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=$(realpath -m "${1:-runs-validate}")
mkdir -p "$RUNS"
SPEC="$RUNS/linear-lr.yaml"
printf 'lr: 0.001\nlr_ref_batch: 16\nlr_warmup_steps: 20\n' > "$SPEC"
threshold() { case $1 in rnnlm-tiny) echo 0.5 ;; sentiment-tiny) echo 0.25 ;; esac; }
COMMON=(--data task --steps 2000 --val-every 5 --val-batches 64 --warmup-steps 2)

done_in() { [ -n "$(find "$1" -maxdepth 2 -name summary.json 2>/dev/null | head -1)" ]; }

for model in rnnlm-tiny sentiment-tiny; do
  for workers in 1 2; do
    engine=$([ "$workers" = 1 ] && echo single || echo ddp)
    for seed in 1 2 3; do
      for batch in 16 32 64 128; do
        dir="$RUNS/batch/$model/w$workers/b$batch-s$seed"
        done_in "$dir" && continue
        rm -rf "$dir"
        launch run --spec "$SPEC" --model "$model" --engine "$engine" --gpus-per-node "$workers" \
          --global-batch "$batch" --seed "$seed" --loss-threshold "$(threshold "$model")" \
          --name "$model-w$workers" "${COMMON[@]}" --runs-dir "$dir" > /dev/null
        echo "batch sweep: $model, $workers worker(s), batch $batch, seed $seed: done" >&2
      done
    done
  done
  for seed in 1 2 3; do
    dir="$RUNS/weak/$model/s$seed"
    done_in "$dir" && continue
    rm -rf "$dir"
    launch sweep --spec "$SPEC" --model "$model" --engine ddp --workers 1,2,4 --mode weak --batch-per-worker 16 \
      --seed "$seed" --loss-threshold "$(threshold "$model")" --name "$model-weak" "${COMMON[@]}" \
      --runs-dir "$dir" > /dev/null
    echo "weak sweep: $model, seed $seed: done" >&2
  done
done
python3 -m scalelab.costs.validation "$RUNS"
