#!/usr/bin/env bash
# GPU check of the graph generation engine (one H200): its CUDA tests, then `asyncppo bench generate` on a
# random-weight Qwen2.5-0.5B-shaped model, graph and hf engines side by side. Run from the repo root on the GPU
# machine with Python 3.12 wheels of what it lacks (ray, pydantic, fastapi, torchdata, rich) in .whl/.
# Writes logs to $OUT (default /tmp/asyncppo-engine). PROFILE=1 adds scripts/profile_decode.py at batch 256.
# E2E=1 adds `asyncppo bench train --workload trl` (TRL's PPO workload, colocated, 6 steps) and, when PEER_SCRIPT names
# TRL's PPOTrainer benchmark script, runs it on the same workload in the same call for the ratio.
# GYM=1 adds 4 steps of the multi-turn gym demo (examples/configs/gym_multi_step.yaml) colocated on the GPU on the
# graph engine, for its prefix-reuse counters. BENCH=0 skips `bench generate`.
set -uo pipefail
OUT=${OUT:-/tmp/asyncppo-engine}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export ASYNCPPO_CACHE_DIR=/tmp/asyncppo-cache PYTHONUNBUFFERED=1
# Compiled kernels are cached per machine; the first engine start pays for them (reported as start-up).
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
model=/tmp/qwen2.5-0.5b-random
[ -d "$model" ] || python3 scripts/make_random_model.py --shape qwen2.5-0.5b --out "$model" > "$OUT/model.log" 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/generation/test_graph_engine_cuda.py -s 2>&1 | tee "$OUT/tests.log" | tail -15
fi
if [ "${BENCH:-1}" = 1 ]; then
python3 -m asyncppo.cli.main bench generate examples/configs/gpu_local_model.yaml model.model_name="$model" \
  cluster.gpus_per_node=1 --batch-sizes "${BATCHES:-256,64}" --prompt-tokens 256 --new-tokens 512 \
  --variable-new-tokens "${VARIABLE:-1024}" --backends "${BACKENDS:-graph,hf}" 2>&1 | tee "$OUT/bench.log" | grep -v Loading
fi
if [ "${GYM:-0}" = 1 ]; then
  timeout "${GYM_TIMEOUT:-240}" python3 -m asyncppo.cli.main train examples/configs/gym_multi_step.yaml \
    --run-dir /tmp/gym-run cluster.device=cuda cluster.gpus_per_node=1 generation.backend=graph \
    generation.colocated.enabled=true ppo.max_num_steps=4 ppo.val_at_start=false checkpointing.enabled=false \
    > "$OUT/gym.log" 2>&1
  echo "gym demo exit $?"; tail -5 "$OUT/gym.log"
  python3 scripts/summarize_run.py /tmp/gym-run --keys train/reward_mean,turn/num_turns_mean,\
generation/prefill_tokens_sent,generation/prefill_tokens_computed,generation/prefill_computed_fraction,\
generation/prefix_hits,timing/generation,timing/step | tee "$OUT/gym_summary.txt"
fi
if [ "${PROFILE:-0}" = 1 ]; then
  python3 scripts/profile_decode.py --model "$model" --batch 256 --window 768 --prefill-rows 32 > "$OUT/profile.log" 2>&1
  grep -v Loading "$OUT/profile.log" | head -120
fi
if [ "${E2E:-0}" = 1 ]; then
  timeout "${E2E_TIMEOUT:-200}" python3 -m asyncppo.cli.main bench train --workload trl --model "$model" --steps 6 \
    > "$OUT/trl_workload.log" 2>&1
  echo "bench train --workload trl exit $?"; grep -v Loading "$OUT/trl_workload.log" | tail -32
  if [ -n "${PEER_SCRIPT:-}" ]; then
    timeout "${PEER_TIMEOUT:-200}" python3 "$PEER_SCRIPT" --shape 0.5b --batch 64 --micro 64 --ckpt on --updates 5 \
      --warmup 1 --budget 150 --out "$OUT" > "$OUT/peer.log" 2>&1
    echo "peer exit $?"; tail -12 "$OUT/peer.log"
  fi
fi
