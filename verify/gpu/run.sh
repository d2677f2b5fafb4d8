#!/usr/bin/env bash
# Run the GPU checks on an offline CUDA machine, from the repository root, with the wheels
# fetched by verify/gpu/fetch_wheels.sh in .whl/{a,b,c}/ (carried there, one bundle a call).
# Usage:
#
#   verify/gpu/run.sh STAGE...     stages: install setup tests tier1 tier1_read tier2 forward
#                                  diagnose bench ncu deepgemm (or: all)
#
# install puts whatever bundle was carried (.whl/a, .whl/b or .whl/c) into $SITE, which stays on
# the machine while it is held: carry a's two parts (one file a call), then b, then c in
# consecutive calls (`install` alone for the first three), and run the stages in the call that
# carries c.
#
# Each stage runs under a time limit: STAGE_TIMEOUT seconds, or TIMEOUT_<stage> for one stage
# (TIMEOUT_bench=330). BENCH_ARGS / TIER2_ARGS / NCU_ARGS are passed to the stage's program;
# TEST_FILES narrows the tests stage to some of the test files the series adds (their names, e.g.
# "test_bf16_mqa_logits.py", or paths under test/registered/).
#
# setup builds sglang-upstream/ from the carried pinned wheel with the same tooling as anywhere
# (`python -m bf16k apply --source wheel --wheel-file ...`) and compiles the kernels for the local
# GPU (`python -m bf16k build`). Results go to build/gpu/<stage>/ and logs to build/gpu/logs/;
# when $OUT is set (the device tool), everything is also packed into $OUT/gpu-results.tgz.
#
# deepgemm builds DeepGEMM from the source bundle .whl/dg (verify/gpu/fetch_deepgemm.sh; carry it
# in the call that runs the stage) into /tmp/bf16k-deepgemm and runs the checks on its first call
# (DEEPGEMM_TESTS="tests/test_attention.py" adds DeepGEMM's own tests; DEEPGEMM_CXX=g++ a second
# build linked by that compiler, run without the preload; DEEPGEMM_CHECKS=0 only the build and the
# preloaded call the later stages rely on, without the crash diagnostics). With USE_DEEPGEMM=1 the
# later stages put that build on the path, with the system g++'s libstdc++ preloaded, so the tests,
# tier 2 and the forward tier use the real DeepGEMM instead of the Triton twin stand-in.
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
DEEPGEMM_SRC=/tmp/bf16k-deepgemm  # the deepgemm stage's build, kept while the machine is held
DEEPGEMM_JIT=/tmp/bf16k-deepgemm-jit
PY=${PYTHON:-python3}
status=0

PARTS=/tmp/bf16k-parts  # parts of wheels carried over several calls, kept while the machine is held

assemble_parts() {  # assemble_parts BUNDLE: every wheel of the bundle whose parts have all arrived
  # into $PARTS/BUNDLE/whole/; fails, saying which, while a part is missing
  local dir=$PARTS/$1 name n have i missing=0
  [ -d "$dir" ] || return 0
  for name in $(ls "$dir" | sed -n 's/\.part-[0-9]*-of-[0-9]*$//p' | sort -u); do
    n=$(ls "$dir" | grep -F "$name.part-" | head -1 | sed 's/.*-of-//')
    have=$(ls "$dir" | grep -cF "$name.part-")
    if [ "$have" != "$n" ]; then
      echo "bundle $1: $name has $have of $n parts; carry the rest in the next call" >&2
      missing=1
      continue
    fi
    mkdir -p "$dir/whole"
    for i in $(seq 1 "$n"); do cat "$dir/$name.part-$i-of-$n"; done > "$dir/whole/$name"
  done
  return $missing
}

stage_install() {  # the carried bundle(s) into $SITE; the pinned sglang wheel kept aside for setup
  local found=0 bundle name part complete w
  local -a wheels
  for bundle in .whl/a .whl/b .whl/c; do
    name=${bundle##*/}
    # A wheel too big to carry beside the repository travels in parts (NAME.whl.part-I-of-N,
    # verify/gpu/fetch_wheels.sh), one or more per call; it is installed once all have arrived.
    for part in "$bundle"/*.whl.part-*-of-*; do
      [ -f "$part" ] || continue
      found=1
      mkdir -p "$PARTS/$name" && cp "$part" "$PARTS/$name/" && echo "bundle $name: received ${part##*/}"
    done
    complete=1
    assemble_parts "$name" || complete=0
    wheels=()
    for w in "$bundle"/*.whl "$PARTS/$name"/whole/*.whl; do [ -f "$w" ] && wheels+=("$w"); done
    [ "${#wheels[@]}" -gt 0 ] || continue
    found=1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" || return 1
    [ "$complete" = 1 ] && touch "$SITE/.installed-$name"
    if ls "$bundle"/upstream/sglang-*.whl >/dev/null 2>&1; then
      mkdir -p /tmp/bf16k-upstream-wheel && cp "$bundle"/upstream/sglang-*.whl /tmp/bf16k-upstream-wheel/
    fi
  done
  [ "$found" = 1 ] || { echo "no wheel bundle carried (.whl/a, .whl/b or .whl/c)" >&2; return 1; }
  ls "$SITE"/.installed-* 2>/dev/null | sed 's/.*installed-/installed bundle /'
}

stage_setup() {
  for b in b c; do  # sglang's imports: transformers in b, the rest and the pinned wheel in c
    [ -f "$SITE/.installed-$b" ] || { echo "setup needs bundles b and c installed (carry .whl/$b; run.sh install)" >&2; return 1; }
  done
  export PYTHONPATH=$SITE
  "$PY" -m bf16k apply --source wheel --wheel-file /tmp/bf16k-upstream-wheel/sglang-*.whl || return 1
  "$PY" -m bf16k build || return 1
  USE_DEEPGEMM=0 with_tree || return 1  # DeepGEMM, if asked for, is built after setup
  "$PY" -c "import sglang.srt.mem_cache.deepseek_v4_memory_pool, sglang.srt.layers.attention.dsv4.compressor_v2, sglang.srt.layers.attention.dsv4.indexer; print('pool, compressor and indexer modules import')" || echo "WARNING: upstream modules do not import; pool-level checks will error"
  # In the packed results, not beside them: the device tool returns at most 8 files from $OUT.
  mkdir -p "$RES/logs"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$RES/logs/gpu.csv"
  "$PY" - > "$RES/logs/env.json" <<'EOF'
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
  export BF16K_STUBBED="${missing# }"  # the packages stubbed (the tests stage deselects what needs them)
  if [ -n "$missing" ]; then
    export PYTHONPATH=$PYTHONPATH:$ROOT/verify/gpu/import_stubs
    echo "note: not installed:$missing; import-time stubs from verify/gpu/import_stubs in use" >&2
  fi
  if [ "${USE_DEEPGEMM:-0}" = 1 ]; then  # the DeepGEMM the deepgemm stage built, as the fp8 scorer
    [ -f "$DEEPGEMM_SRC/.built" ] ||
      { echo "USE_DEEPGEMM=1: run the deepgemm stage first on this machine (carry .whl/dg)" >&2; return 1; }
    # Preloaded: without it DeepGEMM's first JIT call segfaults in std::regex on this image.
    export PYTHONPATH=$DEEPGEMM_SRC:$PYTHONPATH DG_JIT_CACHE_DIR=$DEEPGEMM_JIT
    LD_PRELOAD=$(deepgemm_libstdcxx)${LD_PRELOAD:+:$LD_PRELOAD}
    export LD_PRELOAD
    echo "note: DeepGEMM from $DEEPGEMM_SRC ($(head -1 "$DEEPGEMM_SRC/BF16K_PINS")), LD_PRELOAD=$LD_PRELOAD" >&2
  fi
}

deep_gemm_is_real() {
  "$PY" -c "import deep_gemm, sys; sys.exit(1 if getattr(deep_gemm, 'IS_STUB', False) else 0)" 2>/dev/null
}

stage_tests() {   # the series' own tests: the test files the series adds (test/registered/...), GPU-marked ones included
  with_tree || return 1
  local tree=$ROOT/sglang-upstream real=0 files f hit
  deep_gemm_is_real && real=1  # asked once: each ask imports torch
  if [ "$real" = 0 ]; then
    # Upstream imports DeepGEMM whenever CUDA is present (dsa_backend), so the tests that import
    # the indexer need it importable; test_stubs/ holds a stub whose every name raises if called.
    export PYTHONPATH=$PYTHONPATH:$ROOT/verify/gpu/import_stubs:$ROOT/verify/gpu/test_stubs
    echo "note: deep_gemm not installed: the import-time stub in verify/gpu/test_stubs is in use" >&2
  fi
  # The same list the tooling runs anywhere (python -m bf16k tests): the files the applied series
  # adds to the tree since the base `apply` recorded.
  files=$("$PY" -c 'import sys; from pathlib import Path; from bf16k.seriestests import series_test_files
print("\n".join(series_test_files(Path(sys.argv[1]))))' "$tree") || return 1
  [ -n "$files" ] || { echo "no series tests in $tree (was it applied by python -m bf16k apply?)" >&2; return 1; }
  local args=()
  if [ -n "${TEST_FILES:-}" ]; then   # some of them: file names, or paths under test/registered/
    for f in $TEST_FILES; do
      hit=$(printf '%s\n' "$files" | grep -E "(^|/)${f//./\\.}$")
      [ -n "$hit" ] || { echo "TEST_FILES: $f is none of the series' tests:" >&2; printf '  %s\n' $files >&2; return 1; }
      args+=($hit)
    done
  else
    # shellcheck disable=SC2206
    args=($files)
  fi
  local dispatch=test/registered/unit/layers/attention/test_dsv4_indexer_k_dtype.py
  if [ "$real" = 0 ] && [[ " ${args[*]} " == *" $dispatch "* ]]; then
    # With the stub, the dispatch tests' fp8 branches would call names that raise: they gate on CPU
    # in CI (upstream's torch stand-ins there) and run here only with the real DeepGEMM.
    echo "note: ${dispatch##*/} left out: it needs the real DeepGEMM here (USE_DEEPGEMM=1)" >&2
    local kept=()
    for f in "${args[@]}"; do [ "$f" = "$dispatch" ] || kept+=("$f"); done
    args=("${kept[@]}")
  fi
  if [[ " ${BF16K_STUBBED:-} " == *" sgl_kernel "* ]]; then
    # The HiCache round trip loads pages back through sgl_kernel; with the import stub on the path
    # `import sgl_kernel` succeeds, so the test's own skipUnless(sgl_kernel importable) cannot see
    # that every sgl_kernel call would raise: the stub makes it unrunnable, not the code under test.
    args=(--deselect "test/registered/unit/mem_cache/test_deepseek_v4_indexer_hicache.py::TestDeepSeekV4IndexerHiCacheRoundTrip::test_backup_and_load_round_trip_every_byte" "${args[@]}")
    echo "note: the HiCache load round trip deselected: it needs the real sgl_kernel, which cannot travel here" >&2
  fi
  # Node ids relative to the tree, no product ini (as bf16k.seriestests runs them).
  (cd "$tree" && "$PY" -m pytest -q -rs -p no:cacheprovider -c /dev/null --rootdir=. --durations=15 \
    --junitxml="$RES/tests-junit.xml" "${args[@]}")
}

stage_ncu() {     # Nsight Compute counters for the read kernels (verify/bench/ncu_probe.py)
  with_tree || return 1
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
  with_tree || return 1
  "$PY" -m verify --tiers 1 --out "$RES/verify"
}

stage_tier1_read() {   # tier 1's read parity alone (after a change to the read kernel only)
  with_tree || return 1
  "$PY" -m verify.parity.read --out "$RES/verify/parity"
}

stage_tier2() {  # tier 2 per platform profile (TIER2_PLATFORMS, default "auto"; TIER2_ARGS_<profile> adds options)
  with_tree || return 1
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
  with_tree || return 1
  local base="" args=${FORWARD_ARGS:---platform auto sm120}
  local name=${FORWARD_NAME:-$(date -u +%Y%m%d-%H%M)-$(echo "$args" | sed -n 's/.*--platform \([a-z0-9 ]*\).*/\1/p' | tr ' ' '-' | sed 's/-*$//')}
  [ "${FORWARD_BASELINE:-1}" = 1 ] && baseline_tree && base="--baseline-tree $ROOT/build/upstream-baseline/python"
  # shellcheck disable=SC2086
  "$PY" -m verify.forward --out "$RES/forward/${name:-run}" $base $args
}

stage_diagnose() {  # per-platform fp8 diagnosis (DIAGNOSE_PLATFORMS, default "sm90 sm120"), with
  # every forward-tier run this machine wrote (in time order; each platform's verdicts take its arms)
  with_tree || return 1
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

stage_deepgemm() {  # DeepGEMM built from the carried source (.whl/dg, verify/gpu/fetch_deepgemm.sh)
  # and the checks that place the crash of its paged-MQA metadata call: unbuffered JIT debug
  # output, the JIT cache's contents, a 1-D context_lens (must raise, not crash) and a backtrace.
  local tgz src=$DEEPGEMM_SRC dbg
  tgz=$(ls .whl/dg/deepgemm-*.tar.gz 2>/dev/null | head -1)
  if [ ! -f "$src/.built" ]; then
    [ -n "$tgz" ] || { echo "no DeepGEMM source carried (.whl/dg; verify/gpu/fetch_deepgemm.sh)" >&2; return 1; }
    rm -rf "$src" && mkdir -p "$src" && tar xzf "$tgz" -C "$src" --strip-components=1 || return 1
    echo "DeepGEMM built in this call"
    # setup.py's build_py copies CUTLASS's headers next to the package; build_ext --inplace does not
    cp -r "$src"/third-party/cutlass/include/{cutlass,cute} "$src/deep_gemm/include/" &&
      (cd "$src" && DG_USE_LOCAL_VERSION=0 "$PY" setup.py build_ext --inplace) > "$RES/deepgemm-build.log" 2>&1 ||
      { tail -40 "$RES/deepgemm-build.log"; return 1; }
    touch "$src/.built"
  else
    # its JIT cache too may hold what earlier calls' runs compiled: check 2 then says less
    echo "DeepGEMM build reused from an earlier call on this machine"
  fi
  cat "$src/BF16K_PINS"
  export PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH} DG_JIT_CACHE_DIR=$DEEPGEMM_JIT
  local T='import torch,deep_gemm;cl=torch.full((4,1),300,dtype=torch.int32,device="cuda");m=deep_gemm.get_paged_mqa_logits_metadata(cl,64,deep_gemm.get_num_sms());torch.cuda.synchronize();print("metadata",m[:3].tolist())'
  if [ "${DEEPGEMM_CHECKS:-1}" = 0 ]; then
    # The crash is settled (session 8: a static libstdc++ in the extension; the preload cures it):
    # the build, and the one call the later stages rely on, with the preload they use.
    echo "--- the metadata call with the system g++'s libstdc++ preloaded (DEEPGEMM_CHECKS=0: checks 1-4 left out)"
    LD_PRELOAD=$(deepgemm_libstdcxx) timeout 120 "$PY" -c "$T"; local rc=$?
    echo "exit $rc"
    return $rc
  fi
  echo "--- 1. the metadata call, JIT debug output unbuffered"
  DG_JIT_DEBUG=1 PYTHONFAULTHANDLER=1 timeout 120 stdbuf -o0 -e0 "$PY" -c "$T"; echo "exit $?"
  echo "--- 2. the JIT cache after it"
  ls -R "$DG_JIT_CACHE_DIR" 2>&1 | head -40
  echo "--- 3. a 1-D context_lens (must raise an error, not crash)"
  timeout 60 "$PY" -c "${T/(4,1)/(4,)}" 2>&1 | tail -5; echo "exit ${PIPESTATUS[0]}"
  echo "--- 4. backtrace"
  dbg=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
  if [ -n "$dbg" ]; then
    timeout 240 "$dbg" -q -batch -ex run -ex bt -ex "info sharedlibrary deep_gemm" --args "$PY" -c "$T" 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -60
  else
    echo "no gdb or cuda-gdb on this machine"
  fi
  echo "--- 5. the C++ runtime: what the extension links, what the process maps, and the call with"
  echo "    the compiler's libstdc++ preloaded (session 6: the call above segfaults, this one returns)"
  readelf -d "$src"/deep_gemm/_C*.so | grep -E "NEEDED|RUNPATH|RPATH"
  "$PY" -c 'import torch, deep_gemm, re; print(sorted(set(re.findall(r"/\S*libstdc\+\+\S*", open("/proc/self/maps").read()))))'
  echo "compiler: $(g++ --version | head -1) -> $(deepgemm_libstdcxx)"
  # session 7's build log: the extension is linked by the compiler Python's sysconfig names, not
  # by g++ on PATH; libstdc++ code defined inside it means a static copy of that compiler's
  echo "extension built by: $(grep -m1 -oE '^\S*(g\+\+|c\+\+)' "$RES/deepgemm-build.log" 2>/dev/null) (sysconfig CXX: $("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("CXX"))'))"
  echo "std::locale symbols defined in the extension: $(nm -DC --defined-only "$src"/deep_gemm/_C*.so 2>/dev/null | grep -c 'std::locale')"
  LD_PRELOAD=$(deepgemm_libstdcxx) timeout 120 "$PY" -c "$T"; echo "exit $?"
  if [ -n "${DEEPGEMM_CXX:-}" ]; then  # e.g. g++: a second build linked by that compiler, run without the preload
    local alt=$src-cxx
    echo "--- 6. DeepGEMM built and linked by $DEEPGEMM_CXX (CXX, and LDSHARED=\"$DEEPGEMM_CXX -shared\"), no preload"
    rm -rf "$alt" && mkdir -p "$alt" && tar xzf "$tgz" -C "$alt" --strip-components=1 &&
      cp -r "$alt"/third-party/cutlass/include/{cutlass,cute} "$alt/deep_gemm/include/" &&
      (cd "$alt" && CXX=$DEEPGEMM_CXX LDSHARED="$DEEPGEMM_CXX -shared" DG_USE_LOCAL_VERSION=0 "$PY" setup.py build_ext --inplace) \
        > "$RES/deepgemm-build-cxx.log" 2>&1 || { tail -40 "$RES/deepgemm-build-cxx.log"; return 1; }
    echo "extension built by: $(grep -m1 -oE '^\S*(g\+\+|c\+\+)' "$RES/deepgemm-build-cxx.log")"
    echo "std::locale symbols defined in the extension: $(nm -DC --defined-only "$alt"/deep_gemm/_C*.so 2>/dev/null | grep -c 'std::locale')"
    PYTHONPATH=$alt:${PYTHONPATH#"$src":} DG_JIT_CACHE_DIR=$DEEPGEMM_JIT-cxx timeout 120 "$PY" -c "$T"; echo "exit $?"
  fi
  if [ -n "${DEEPGEMM_TESTS:-}" ]; then  # e.g. "tests/test_attention.py": DeepGEMM's own tests
    # shellcheck disable=SC2086
    (cd "$src" && LD_PRELOAD=$(deepgemm_libstdcxx) timeout "${DEEPGEMM_TESTS_TIMEOUT:-240}" "$PY" -u $DEEPGEMM_TESTS) 2>&1 | tail -60
  fi
}

deepgemm_libstdcxx() {  # the libstdc++ of g++ on PATH, the one the process maps (DeepGEMM's
  # extension itself is linked by the compiler Python's sysconfig names: step 5 of the stage)
  readlink -f "$(g++ -print-file-name=libstdc++.so.6)"
}

stage_bench() {
  with_tree || return 1
  # shellcheck disable=SC2086
  "$PY" -m verify.bench --out "$RES/bench" ${BENCH_ARGS:-}
  local rc=$?
  # README's speed section as this run would make it (python -m verify.figures --write writes it
  # once the results are committed in verify/results/h200/bench/).
  "$PY" -m verify.bench.report --results "$RES/bench" --print > "$RES/bench/README-speed.md" ||
    echo "note: could not render README's speed section from this run" >&2
  return $rc
}

# The device tool's copy of the repository empties sglang-upstream/ (a nested repository) on
# every call, so the applied tree is kept in /tmp while the machine is held and put back at the
# start of a later call that does not run setup, if the series it was applied from is unchanged.
KEPT=/tmp/bf16k-applied-tree
series_id() { find series -type f -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-16; }
keep_tree() {
  [ -d sglang-upstream/python/sglang ] || return 0
  rm -rf "$KEPT" && cp -a sglang-upstream "$KEPT" && series_id > "$KEPT.series"
}
restore_tree() {
  [ -d sglang-upstream/python/sglang ] && return 0
  [ -d "$KEPT/python/sglang" ] || return 0
  if [ "$(cat "$KEPT.series" 2>/dev/null)" != "$(series_id)" ]; then
    echo "note: the applied tree kept in $KEPT is of another series; run setup again" >&2
    return 0
  fi
  rm -rf sglang-upstream && cp -a "$KEPT" sglang-upstream && echo "note: applied tree restored from $KEPT" >&2
}

stages=("$@")
[ "${stages[*]:-}" = "all" ] && stages=(install setup tests tier1 tier2 forward diagnose bench ncu)
[[ " ${stages[*]} " == *" setup "* ]] || restore_tree
for s in "${stages[@]}"; do
  start=$(date +%s)
  echo "=== stage $s" | tee -a "$LOGS/stages.log"
  case "$s" in
    install|setup|tests|tier1|tier1_read|tier2|forward|diagnose|bench|ncu|deepgemm)
      limit_var=TIMEOUT_$s
      export -f "stage_$s" with_tree deep_gemm_is_real baseline_tree deepgemm_libstdcxx assemble_parts
      export ROOT RES LOGS SITE PARTS DEEPGEMM_SRC DEEPGEMM_JIT PY USE_DEEPGEMM DEEPGEMM_CXX DEEPGEMM_TESTS_TIMEOUT TIER2_ARGS TIER2_PLATFORMS TIER2_ARGS_sm90 TIER2_ARGS_sm120 TIER2_ARGS_auto BENCH_ARGS NCU_ARGS TEST_FILES FORWARD_ARGS FORWARD_NAME FORWARD_BASELINE DIAGNOSE_PLATFORMS DEEPGEMM_TESTS DEEPGEMM_CHECKS
      log=$LOGS/$s.log n=2
      while [ -e "$log" ]; do log=$LOGS/$s-$n.log; n=$((n + 1)); done  # a stage run twice keeps both logs
      timeout "${!limit_var:-$STAGE_TIMEOUT}" bash -c "stage_$s" > >(tee "$log") 2>&1; rc=$? ;;
    *) echo "unknown stage $s"; rc=2 ;;
  esac
  echo "=== stage $s: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$LOGS/stages.log"
  # packed after every stage: a call cut off at the device's limit still returns what ran
  [ -n "${OUT:-}" ] && tar -czf "$OUT/gpu-results.tgz" -C "$ROOT/build" gpu 2>/dev/null
  [ "$rc" -ne 0 ] && status=1
  { [ "$s" = setup ] || [ "$s" = install ]; } && [ "$rc" -ne 0 ] && break
  [ "$s" = setup ] && keep_tree
done
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/gpu-results.tgz" -C "$ROOT/build" gpu
fi
exit $status
