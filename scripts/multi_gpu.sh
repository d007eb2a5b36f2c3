#!/usr/bin/env bash
# The multi-GPU measurements, one script for one device call: async vs sync, data-parallel training, weight sync
# at scale, and the gym demo over several generators. Each run needs a number of GPUs; with fewer visible it prints
# "skipped" with the count it needs, so the script also dry-runs on one GPU (the 1-rank policy MFU rows run there).
# Run from the repo root on the GPU machine (Python 3.12 wheels of what it lacks in .whl/, as scripts/gpu_engine.sh).
# Logs and a summary go to $OUT (default /tmp/asyncppo-multi-gpu).
#   1. >= 2 GPUs: scripts/bench_async.py, 0.5B shape, 1 generator + 1 trainer, 256 samples x (256 + up to 1024
#      tokens, natural EOS), STEPS steps (default 30): sync vs async (drain), then sync vs async (in-flight).
#   2. policy MFU (scripts/policy_mfu.py) on TRL's workload (`asyncppo bench train --workload trl`): 1 rank colocated for the 0.5B and 1.5B shapes (any GPU
#      count); >= 4 GPUs: 2 trainer ranks (FSDP2) + 2 generators, same workload, and steps/s against 2 GPUs
#      (1 trainer + 1 generator).
#      >= 2 GPUs: scripts/bench_weight_sync.py over NCCL with the 1.5B shape's bf16 bytes (2944 MB).
#   3. >= 3 GPUs: the gym multi-turn demo async with 2 generators (2 policy servers) vs 1: rollouts/s.
set -uo pipefail
OUT=${OUT:-/tmp/asyncppo-multi-gpu}
STEPS=${STEPS:-30}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export ASYNCPPO_CACHE_DIR=/tmp/asyncppo-cache PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
gpus=$(nvidia-smi -L | wc -l)
echo "visible GPUs: $gpus" | tee "$OUT/summary.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv >> "$OUT/summary.txt"
for shape in 0.5b 1.5b; do
  model=/tmp/qwen2.5-$shape-random
  [ -d "$model" ] || python3 scripts/make_random_model.py --shape "qwen2.5-$shape" --out "$model" > "$OUT/model-$shape.log" 2>&1
done
m05=/tmp/qwen2.5-0.5b-random
m15=/tmp/qwen2.5-1.5b-random
needs() {  # needs N WHAT: true when N GPUs are visible, else a "skipped" line in the summary
  if [ "$gpus" -ge "$1" ]; then return 0; fi
  echo "skipped: $2 (needs $1 GPUs, $gpus visible)" | tee -a "$OUT/summary.txt"
  return 1
}

# 1. async vs sync on 2 GPUs
if needs 2 "run 1, bench_async sync vs async"; then
  workload=(examples/configs/gpu_local_model.yaml model.model_name=$m05 cluster.gpus_per_node=2
    generation.num_workers=1 ppo.num_prompts_per_step=32 ppo.num_generations_per_prompt=8
    generation.max_new_tokens=1024 model.max_total_sequence_length=1280 value.max_total_sequence_length=1280)
  python3 scripts/bench_async.py "${workload[@]}" --steps "$STEPS" > "$OUT/async_drain.log" 2>&1
  python3 scripts/bench_async.py "${workload[@]}" --steps "$STEPS" --in-flight > "$OUT/async_in_flight.log" 2>&1
  for log in async_drain async_in_flight; do
    echo "== $log" >> "$OUT/summary.txt"; tail -6 "$OUT/$log.log" >> "$OUT/summary.txt"
  done
fi

# 2. policy MFU: 1 rank (colocated), then 2 ranks + 2 generators; weight sync of 1.5B
for shape in 0.5b 1.5b; do
  model=/tmp/qwen2.5-$shape-random
  timeout "${MFU_TIMEOUT:-240}" python3 -m asyncppo.cli.main bench train --workload trl --model "$model" --steps 5 \
    --run-dir "$OUT/mfu-1rank-$shape" > "$OUT/mfu-1rank-$shape.log" 2>&1
  echo "== 1 rank, $shape: $(grep '^| later steps s' "$OUT/mfu-1rank-$shape.log")" >> "$OUT/summary.txt"
  python3 scripts/policy_mfu.py "$OUT/mfu-1rank-$shape/packed" --model "$model" --ranks 1 >> "$OUT/summary.txt" 2>&1
done
if needs 4 "run 2, 2 trainer ranks + 2 generators"; then
  for layout in "2 1" "4 2"; do
    set -- $layout
    python3 -m asyncppo.cli.main bench train --workload trl --model "$m15" --steps 8 --run-dir "$OUT/dp-$1gpus" \
      cluster.gpus_per_node="$1" generation.colocated.enabled=false generation.num_workers="$2" \
      > "$OUT/dp-$1gpus.log" 2>&1
    echo "== $1 GPUs ($2 generators), 1.5b: $(grep '^| later steps s' "$OUT/dp-$1gpus.log")" >> "$OUT/summary.txt"
    python3 scripts/policy_mfu.py "$OUT/dp-$1gpus/packed" --model "$m15" --ranks $(($1 - $2)) >> "$OUT/summary.txt" 2>&1
  done
fi
if needs 2 "weight sync of the 1.5B shape over NCCL"; then
  python3 scripts/bench_weight_sync.py --backend nccl --dtype bfloat16 --sizes-mb 2944 > "$OUT/weight_sync.log" 2>&1
  echo "== weight sync" >> "$OUT/summary.txt"; tail -4 "$OUT/weight_sync.log" >> "$OUT/summary.txt"
fi

# 3. the gym demo over 1 and 2 generators
if needs 3 "run 3, gym demo with 2 generators"; then
  for generators in 1 2; do
    timeout "${GYM_TIMEOUT:-300}" python3 -m asyncppo.cli.main train examples/configs/gym_multi_step.yaml \
      --run-dir "$OUT/gym-$generators" cluster.device=cuda cluster.gpus_per_node=$((generators + 1)) \
      generation.backend=graph generation.colocated.enabled=false generation.num_workers="$generators" \
      ppo.async_ppo.enabled=true loss_fn.use_importance_sampling_correction=true ppo.max_num_steps=8 \
      ppo.val_at_start=false checkpointing.enabled=false > "$OUT/gym-$generators.log" 2>&1
    python3 scripts/summarize_run.py "$OUT/gym-$generators" --keys timing/step,timing/generation,train/num_samples \
      > "$OUT/gym-$generators-summary.txt"
    echo "== gym, $generators generator(s)" >> "$OUT/summary.txt"; cat "$OUT/gym-$generators-summary.txt" >> "$OUT/summary.txt"
  done
fi
cat "$OUT/summary.txt"
