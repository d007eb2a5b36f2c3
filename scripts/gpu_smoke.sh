#!/usr/bin/env bash
# GPU smoke run (two GPUs): a few PPO steps of a random-weight Qwen2.5-0.5B-shaped model, non-colocated
# (1 generator GPU, 1 trainer GPU, NCCL weight sync), then colocated on one GPU. Run from the repo root on
# the GPU machine, with Python 3.12 wheels of what it lacks (ray, pydantic, fastapi, torchdata, rich, ...) in .whl/.
# Writes logs and per-step tables to $OUT (default /tmp/asyncppo-smoke).
set -euo pipefail
OUT=${OUT:-/tmp/asyncppo-smoke}
STEPS=${STEPS:-4}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export ASYNCPPO_CACHE_DIR=/tmp/asyncppo-cache
model=/tmp/qwen2.5-0.5b-random
[ -d "$model" ] || python3 scripts/make_random_model.py --shape qwen2.5-0.5b --out "$model"
common=(model.model_name="$model" ppo.max_num_steps="$STEPS" ppo.val_period=0 ppo.val_at_end=false
        logger.tensorboard_enabled=false logger.console=false checkpointing.save_period=1000)
for mode in noncolocated colocated; do
  extra=()
  [ "$mode" = colocated ] && extra=(generation.colocated.enabled=true cluster.gpus_per_node=1)
  run_dir=/tmp/asyncppo-smoke-$mode
  rm -rf "$run_dir"
  start=$(date +%s)
  python3 -m asyncppo train examples/configs/gpu_local_model.yaml --run-dir "$run_dir" "${common[@]}" "${extra[@]}" \
    > "$OUT/$mode.log" 2>&1 || { tail -50 "$OUT/$mode.log"; exit 1; }
  echo "== $mode: $(( $(date +%s) - start )) s wall including start-up" | tee -a "$OUT/summary.txt"
  python3 scripts/summarize_run.py "$run_dir" | tee -a "$OUT/summary.txt"
done
