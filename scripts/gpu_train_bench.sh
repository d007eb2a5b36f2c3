#!/usr/bin/env bash
# The trainer's GPU measurements in one call (one H200): the CUDA tests of the packed attention and the fused
# output head, `asyncppo bench train` on the `trl` workload (0.5B and 1.5B shapes), TRL's PPOTrainer on the same
# workload when PEER_SCRIPT names its benchmark script, and the `longtail` workload packed vs padded. Each piece
# has its own time limit, so one that runs long leaves the others' numbers. Logs go to $OUT (default
# /tmp/asyncppo-train-bench). Run from the repo root with the wheels the machine lacks in .whl/.
# PIECES picks and orders them (default: tests trl05 peer trl15 longtail05); PASS=1 adds
# scripts/bench_train_pass.py (the training passes alone, with a profile). BENCH_ARGS are key=value overrides for
# every bench piece (e.g. "model.compile=false value.compile=false" for eager layers) and TAG prefixes their log
# names, so two passes over the pieces in one call keep both sets of logs. TORCH_LOGS=recompiles (the default here)
# logs each recompiled graph with its reason; each bench piece prints their count. SRC (default src/) runs another
# copy of the sources, e.g. a baseline commit's (`git archive REV src | tar -x -C DIR`), for a same-machine before/after.
set -uo pipefail
OUT=${OUT:-/tmp/asyncppo-train-bench}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${SRC:-$PWD/src}
fi
export ASYNCPPO_CACHE_DIR=/tmp/asyncppo-cache PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache} TORCH_LOGS=${TORCH_LOGS-recompiles}
TAG=${TAG:-}
m05=/tmp/qwen2.5-0.5b-random m15=/tmp/qwen2.5-1.5b-random
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
bench() {  # bench NAME TIMEOUT ARGS...: one `asyncppo bench train` into $OUT/$TAG$NAME.log, its tables on stdout
  local name=$TAG$1 limit=$2
  shift 2
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of overrides
  timeout "$limit" python3 -m asyncppo.cli.main bench train "$@" ${BENCH_ARGS:-} > "$OUT/$name.log" 2>&1
  echo "== $name exit $? (${BENCH_ARGS:-compile as configured}); recompiles: $(grep -c 'Recompiling function' "$OUT/$name.log")"
  grep -v -e Loading -e Warning -e warn -e '\[__recompiles' "$OUT/$name.log" | tail -${TAIL:-40}
}
for piece in ${PIECES:-tests trl05 peer trl15 longtail05}; do
  case $piece in
    tests)
      timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider tests/models/test_packing.py \
        tests/models/test_output_head.py tests/models/test_compiled_layers.py 2>&1 | tail -${TESTS_TAIL:-4} ;;
    trl05)
      [ -d $m05 ] || python3 scripts/make_random_model.py --shape qwen2.5-0.5b --out $m05 > /dev/null 2>&1
      bench trl05 ${TRL_TIMEOUT:-150} --workload trl --model $m05 --steps ${TRL_STEPS:-6} ;;
    trl15)
      [ -d $m15 ] || python3 scripts/make_random_model.py --shape qwen2.5-1.5b --out $m15 > /dev/null 2>&1
      # 16 rows (12,288 tokens) per micro-batch: the 1.5B policy, critic and reference share the GPU.
      bench trl15 ${TRL_TIMEOUT:-150} --workload trl --model $m15 --steps ${TRL_STEPS:-6} \
        model.max_tokens_per_microbatch=null value.max_tokens_per_microbatch=null ;;
    longtail05)
      [ -d $m05 ] || python3 scripts/make_random_model.py --shape qwen2.5-0.5b --out $m05 > /dev/null 2>&1
      bench longtail05 ${LONGTAIL_TIMEOUT:-300} --workload longtail --model $m05 --steps ${LONGTAIL_STEPS:-3} \
        --padded both ;;
    longtail15)
      [ -d $m15 ] || python3 scripts/make_random_model.py --shape qwen2.5-1.5b --out $m15 > /dev/null 2>&1
      bench longtail15 ${LONGTAIL_TIMEOUT:-300} --workload longtail --model $m15 --steps ${LONGTAIL_STEPS:-3} \
        --padded both ;;
    peer)
      [ -n "${PEER_SCRIPT:-}" ] || continue
      timeout "${PEER_TIMEOUT:-170}" python3 "$PEER_SCRIPT" --shape 0.5b --batch 64 --micro 64 --ckpt on \
        --updates ${PEER_UPDATES:-3} --warmup 1 --budget 150 --out "$OUT" > "$OUT/peer.log" 2>&1
      echo "== peer exit $?"; tail -8 "$OUT/peer.log" ;;
    pass)
      [ -d $m05 ] || python3 scripts/make_random_model.py --shape qwen2.5-0.5b --out $m05 > /dev/null 2>&1
      timeout ${PASS_TIMEOUT:-200} python3 scripts/bench_train_pass.py --model $m05 --lengths fixed \
        --settings packed32k --repeats 3 --profile ${PASS_ARGS:-} 2>&1 | grep -v Loading > "$OUT/pass.log"
      tail -40 "$OUT/pass.log" ;;
  esac
done
