#!/usr/bin/env bash
# Run the GPU checks on an offline CUDA machine, from the repository root, with the wheels
# fetched by verify/gpu/fetch_wheels.sh in .whl/ (carried there). Usage:
#
#   verify/gpu/run.sh STAGE...     stages: setup tests tier1 tier2 bench (or: all)
#
# setup builds sglang-upstream/ from the carried pinned wheel with the same tooling as anywhere
# (`python -m bf16k apply --source wheel --wheel-file ...`) and compiles the kernels for the local
# GPU (`python -m bf16k build`). Results go to build/gpu/<stage>/ and logs to build/gpu/logs/;
# when $OUT is set (the device tool), everything is also packed into $OUT/gpu-results.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
RES=$ROOT/build/gpu
# Logs go straight to $OUT when the device tool runs this, so a run cut off at its time limit
# still returns them.
LOGS=${OUT:-$RES/logs}
mkdir -p "$RES" "$LOGS"
STAGE_TIMEOUT=${STAGE_TIMEOUT:-540}
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export BF16K_CACHE_DIR=${BF16K_CACHE_DIR:-/tmp/bf16k-cache}
export SGLANG_JIT_CACHE_DIR=$ROOT/build/jit-cache
SITE=/tmp/bf16k-site
PY=${PYTHON:-python3}
status=0

stage_setup() {
  if [ ! -f "$SITE/.done" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || return 1
    touch "$SITE/.done"
  fi
  export PYTHONPATH=$SITE
  "$PY" -m bf16k apply --source wheel --wheel-file .whl/upstream/sglang-*.whl || return 1
  "$PY" -m bf16k build || return 1
  with_tree
  "$PY" -c "import sglang.srt.mem_cache.deepseek_v4_memory_pool, sglang.srt.layers.attention.dsv4.compressor_v2, sglang.srt.layers.attention.dsv4.indexer; print('pool, compressor and indexer modules import')" || echo "WARNING: upstream modules do not import; pool-level checks will error"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$LOGS/gpu.csv"
  "$PY" - > "$LOGS/env.json" <<'EOF'
import json, platform, torch, triton
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
                  "gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability()}))
EOF
}

with_tree() {
  export PYTHONPATH=$ROOT/sglang-upstream/python:$ROOT:$SITE
  # Kernel libraries that cannot be carried get import-time stubs (see import_stubs/); a real
  # install earlier on the path still wins.
  local missing=""
  for pkg in sgl_kernel flashinfer; do "$PY" -c "import $pkg" 2>/dev/null || missing="$missing $pkg"; done
  if [ -n "$missing" ]; then
    export PYTHONPATH=$PYTHONPATH:$ROOT/verify/gpu/import_stubs
    echo "note: not installed:$missing; import-time stubs from verify/gpu/import_stubs in use" >&2
  fi
}

stage_tests() {   # the series' own upstream-style tests, GPU-marked ones included
  with_tree
  local skip=()
  # test_dispatch imports the whole indexer module, whose import chain needs DeepGEMM (not
  # carried to the GPU machine); it runs on CPU in CI (`nox -s tests`).
  if ! "$PY" -c "import deep_gemm" 2>/dev/null; then
    skip=(--ignore=sglang-upstream/python/sglang/test/dsv4_bf16_index_k/test_dispatch.py)
    echo "note: deep_gemm not installed: test_dispatch.py left out here" >&2
  fi
  "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$RES/tests-junit.xml" "${skip[@]}" \
    sglang-upstream/python/sglang/test/dsv4_bf16_index_k
}

stage_tier1() {
  with_tree
  "$PY" -m verify --tiers 1 --out "$RES/verify"
}

stage_tier2() {
  with_tree
  # shellcheck disable=SC2086
  "$PY" -m verify --tiers 2 --out "$RES/verify" ${TIER2_ARGS:-}
}

stage_bench() {
  with_tree
  # shellcheck disable=SC2086
  "$PY" -m verify.bench --out "$RES/bench" ${BENCH_ARGS:-}
}

stages=("$@")
[ "${stages[*]:-}" = "all" ] && stages=(setup tests tier1 tier2 bench)
for s in "${stages[@]}"; do
  start=$(date +%s)
  echo "=== stage $s" | tee -a "$LOGS/stages.log"
  case "$s" in
    setup|tests|tier1|tier2|bench)
      export -f "stage_$s" with_tree; export ROOT RES LOGS SITE PY TIER2_ARGS BENCH_ARGS
      timeout "$STAGE_TIMEOUT" bash -c "stage_$s" > >(tee "$LOGS/$s.log") 2>&1; rc=$? ;;
    *) echo "unknown stage $s"; rc=2 ;;
  esac
  echo "=== stage $s: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$LOGS/stages.log"
  [ "$rc" -ne 0 ] && status=1
  [ "$s" = setup ] && [ "$rc" -ne 0 ] && break
done
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/gpu-results.tgz" -C "$ROOT/build" gpu
fi
exit $status
