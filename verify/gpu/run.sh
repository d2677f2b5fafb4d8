#!/usr/bin/env bash
# Run the GPU checks on an offline CUDA machine, from the repository root, with the wheels
# fetched by verify/gpu/fetch_wheels.sh in .whl/{a,b,c}/ (carried there, one bundle a call).
# Usage:
#
#   verify/gpu/run.sh STAGE...     stages: install setup tests tier1 tier1_read tier2 forward
#                                  diagnose bench ncu (or: all)
#
# install puts whatever bundle was carried (.whl/a, .whl/b or .whl/c) into $SITE, which stays on
# the machine while it is held: carry a, then b, then c in consecutive calls (`install` alone for
# the first two), and run the stages in the call that carries c.
#
# Each stage runs under a time limit: STAGE_TIMEOUT seconds, or TIMEOUT_<stage> for one stage
# (TIMEOUT_bench=330). BENCH_ARGS / TIER2_ARGS / NCU_ARGS are passed to the stage's program;
# TEST_FILES (names in the series' test folder) narrows the tests stage.
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

stage_install() {  # the carried bundle(s) into $SITE; the pinned sglang wheel kept aside for setup
  local found=0
  for bundle in .whl/a .whl/b .whl/c; do
    ls "$bundle"/*.whl >/dev/null 2>&1 || continue
    found=1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$bundle"/*.whl || return 1
    touch "$SITE/.installed-${bundle##*/}"
    if ls "$bundle"/upstream/sglang-*.whl >/dev/null 2>&1; then
      mkdir -p /tmp/bf16k-upstream-wheel && cp "$bundle"/upstream/sglang-*.whl /tmp/bf16k-upstream-wheel/
    fi
  done
  [ "$found" = 1 ] || { echo "no wheel bundle carried (.whl/a, .whl/b or .whl/c)" >&2; return 1; }
  ls "$SITE"/.installed-* | sed 's/.*installed-/installed bundle /'
}

stage_setup() {
  for b in b c; do  # sglang's imports: transformers in b, the rest and the pinned wheel in c
    [ -f "$SITE/.installed-$b" ] || { echo "setup needs bundles b and c installed (carry .whl/$b; run.sh install)" >&2; return 1; }
  done
  export PYTHONPATH=$SITE
  "$PY" -m bf16k apply --source wheel --wheel-file /tmp/bf16k-upstream-wheel/sglang-*.whl || return 1
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

deep_gemm_is_real() {
  "$PY" -c "import deep_gemm, sys; sys.exit(1 if getattr(deep_gemm, 'IS_STUB', False) else 0)" 2>/dev/null
}

stage_tests() {   # the series' own upstream-style tests, GPU-marked ones included
  with_tree
  local tests=sglang-upstream/python/sglang/test/dsv4_bf16_index_k
  if ! deep_gemm_is_real; then
    # Upstream imports DeepGEMM whenever CUDA is present (dsa_backend), so the tests that import
    # the indexer need it importable; test_stubs/ holds a stub whose every name raises if called.
    export PYTHONPATH=$PYTHONPATH:$ROOT/verify/gpu/import_stubs:$ROOT/verify/gpu/test_stubs
    echo "note: deep_gemm not installed: the import-time stub in verify/gpu/test_stubs is in use" >&2
  fi
  if [ -n "${TEST_FILES:-}" ]; then   # a subset, e.g. TEST_FILES="test_indexer_capture.py"
    local files=()
    for f in $TEST_FILES; do files+=("$tests/$f"); done
    "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$RES/tests-junit.xml" "${files[@]}"
    return $?
  fi
  "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$RES/tests-junit.xml" \
    --ignore=$tests/test_dispatch.py $tests
  local rc=$?
  # The dispatch tests drive the fp8 branches too, which call DeepGEMM; with the stub they show
  # which tests need the real library. Reported, not gating (they gate on CPU in CI).
  echo "=== test_dispatch.py (not gating here)"
  "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$RES/tests-dispatch-junit.xml" \
    $tests/test_dispatch.py || echo "note: test_dispatch.py had failures on this machine (see above)"
  return $rc
}

stage_ncu() {     # Nsight Compute counters for the read kernels (verify/bench/ncu_probe.py)
  with_tree
  mkdir -p "$RES/ncu"
  local metrics
  metrics=$("$PY" -m verify.bench.ncu_probe --print-metrics) || return 1
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [ -n "$ncu" ] || { echo "ncu (Nsight Compute) not found on this machine" >&2; return 1; }
  # shellcheck disable=SC2086
  "$ncu" --clock-control none --profile-from-start off --csv --page raw --print-units base \
    --metrics "$metrics" --log-file "$RES/ncu/ncu.csv" \
    "$PY" -m verify.bench.ncu_probe --out "$RES/ncu" ${NCU_ARGS:-} || return 1
  "$PY" -m verify.bench.ncu_probe --report "$RES/ncu"
}

stage_tier1() {
  with_tree
  "$PY" -m verify --tiers 1 --out "$RES/verify"
}

stage_tier1_read() {   # tier 1's read parity alone (after a change to the read kernel only)
  with_tree
  "$PY" -m verify.parity.read --out "$RES/verify/parity"
}

stage_tier2() {  # tier 2 per platform profile (TIER2_PLATFORMS, default "auto"; TIER2_ARGS_<profile> adds options)
  with_tree
  local p rc=0 extra
  for p in ${TIER2_PLATFORMS:-auto}; do
    extra=TIER2_ARGS_$p
    # shellcheck disable=SC2086
    "$PY" -m verify --tiers 2 --platform "$p" --out "$RES/verify-$p" ${TIER2_ARGS:-} ${!extra:-} || rc=1
  done
  return $rc
}

stage_forward() {  # the forward tier (FORWARD_ARGS, e.g. "--quick --platform auto sm120") into
  # forward/$FORWARD_NAME (default: the platforms), so runs of several calls sit side by side
  with_tree
  local base="" args=${FORWARD_ARGS:---platform auto sm120}
  local name=${FORWARD_NAME:-$(date -u +%Y%m%d-%H%M)-$(echo "$args" | sed -n 's/.*--platform \([a-z0-9 ]*\).*/\1/p' | tr ' ' '-' | sed 's/-*$//')}
  [ "${FORWARD_BASELINE:-1}" = 1 ] && baseline_tree && base="--baseline-tree $ROOT/build/upstream-baseline/python"
  # shellcheck disable=SC2086
  "$PY" -m verify.forward --out "$RES/forward/${name:-run}" $base $args
}

stage_diagnose() {  # per-platform fp8 diagnosis (DIAGNOSE_PLATFORMS, default "sm90 sm120"), with
  # every forward-tier run this machine wrote (in time order; each platform's verdicts take its arms)
  with_tree
  local p rc=0 fwd
  fwd=$(ls -d "$RES"/forward/*/ 2>/dev/null | sort | tr '\n' ' ')
  for p in ${DIAGNOSE_PLATFORMS:-sm90 sm120}; do
    # shellcheck disable=SC2086
    "$PY" -m verify.recall.diagnose --backend gpu --platform "$p" --out "$RES/diagnose/$p" ${fwd:+--forward $fwd} || rc=1
  done
  return $rc
}

baseline_tree() {  # an unpatched tree at the base commit (the flag-off bit-identity checks)
  [ -d "$ROOT/build/upstream-baseline/python/sglang" ] && return 0
  local base
  base=$(git -C "$ROOT/sglang-upstream" rev-parse -q --verify refs/patches/upstream-head) || return 1
  rm -rf "$ROOT/build/upstream-baseline"
  git clone -q --shared --no-checkout "$ROOT/sglang-upstream" "$ROOT/build/upstream-baseline" &&
    git -C "$ROOT/build/upstream-baseline" checkout -q -f --detach "$base"
}

stage_bench() {
  with_tree
  # shellcheck disable=SC2086
  "$PY" -m verify.bench --out "$RES/bench" ${BENCH_ARGS:-}
  local rc=$?
  # README's speed section as this run would make it (python -m verify.bench.report --write,
  # once the results are committed in verify/results/h200/bench/).
  "$PY" -m verify.bench.report --results "$RES/bench" --print > "$RES/bench/README-speed.md" ||
    echo "note: could not render README's speed section from this run" >&2
  return $rc
}

stages=("$@")
[ "${stages[*]:-}" = "all" ] && stages=(install setup tests tier1 tier2 forward diagnose bench ncu)
for s in "${stages[@]}"; do
  start=$(date +%s)
  echo "=== stage $s" | tee -a "$LOGS/stages.log"
  case "$s" in
    install|setup|tests|tier1|tier1_read|tier2|forward|diagnose|bench|ncu)
      limit_var=TIMEOUT_$s
      export -f "stage_$s" with_tree deep_gemm_is_real baseline_tree
      export ROOT RES LOGS SITE PY TIER2_ARGS TIER2_PLATFORMS TIER2_ARGS_sm90 TIER2_ARGS_sm120 TIER2_ARGS_auto BENCH_ARGS NCU_ARGS TEST_FILES FORWARD_ARGS FORWARD_NAME FORWARD_BASELINE DIAGNOSE_PLATFORMS
      timeout "${!limit_var:-$STAGE_TIMEOUT}" bash -c "stage_$s" > >(tee "$LOGS/$s.log") 2>&1; rc=$? ;;
    *) echo "unknown stage $s"; rc=2 ;;
  esac
  echo "=== stage $s: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$LOGS/stages.log"
  # packed after every stage: a call cut off at the device's limit still returns what ran
  [ -n "${OUT:-}" ] && tar -czf "$OUT/gpu-results.tgz" -C "$ROOT/build" gpu 2>/dev/null
  [ "$rc" -ne 0 ] && status=1
  { [ "$s" = setup ] || [ "$s" = install ]; } && [ "$rc" -ne 0 ] && break
done
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/gpu-results.tgz" -C "$ROOT/build" gpu
fi
exit $status
