#!/usr/bin/env bash
# Download, on a networked machine, exactly the wheels the GPU checks need on the (offline) GPU
# machine, into .whl/ (git-ignored), split into carry bundles that each fit one device call
# (64 MiB per call, the repository included):
#
#   .whl/a/  tilelang 0.1.12                     (upstream's sm_120 C4 scorer, ~50 MB) in two
#            parts (NAME.whl.part-1-of-2, -2-of-2): with the repository's ~17 MB the whole wheel
#            no longer fits one call, so carry one part per call; install assembles them
#   .whl/b/  z3-solver, torch-c-dlpack-ext, cloudpickle, ml-dtypes (TileLang's needs) and
#            transformers, tokenizers (sglang's config imports), ~45 MB
#   .whl/c/  sglang's other JIT-loader / import needs (~14 MB) and c/upstream/ the pinned sglang
#            wheel (~30 MB); transformers moved to b so that c plus the ~10 MB repository stays
#            under one call's 64 MiB
#
# Carry them in consecutive calls while the machine is warm (`carry: [".whl/a/<part 1>"]`, then
# `[".whl/a/<part 2>"]`, `[".whl/b"]`, then `[".whl/c"]`); each call starts with `verify/gpu/run.sh install`, which
# installs whatever bundle it finds into /tmp/bf16k-site (kept while the machine is held). The
# bundle a is needed only for the sm120 profile; b and c for everything.
# The GPU image has Python 3.12, torch, triton, numpy, matplotlib.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
mkdir -p "$dest/a" "$dest/b" "$dest/c/upstream"
py=${PYTHON:-python3}
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64)
get() {  # get DIR PKG...
  local dir=$1; shift
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${plat[@]}" -d "$dir" "$@"
}
get "$dest/a" tilelang==0.1.12
get "$dest/b" z3-solver==4.15.4.0 torch-c-dlpack-ext==0.1.5 cloudpickle ml-dtypes \
  transformers==5.12.1 tokenizers==0.22.2
get "$dest/c" \
  apache-tvm-ffi==0.1.11 msgspec orjson pybase64 starlette pyzmq pydantic pydantic_core annotated_types \
  typing_inspection dill ipython decorator jedi parso matplotlib-inline pexpect prompt_toolkit stack_data \
  traitlets wcwidth asttokens executing pure_eval ptyprocess ipython_pygments_lexers \
  compressed-tensors==0.18.0 loguru gguf \
  openai==2.6.1 jiter distro sniffio partial_json_parser
# The pinned upstream wheel, from the bf16k cache when `nox -s apply` already fetched it.
whl=$("$py" -c 'import tomllib;print(tomllib.load(open("pin.toml","rb"))["wheel"]["filename"])')
cache=${BF16K_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bf16k}/wheels/$whl
if [ -f "$cache" ]; then cp "$cache" "$dest/c/upstream/"; else
  v=${whl#sglang-}; v=${v%%-*}
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --abi cp311 --platform manylinux_2_34_x86_64 -d "$dest/c/upstream" "sglang==$v"
fi
# Wheels over 30 MB travel in parts (verify/gpu/run.sh's install assembles them).
for w in "$dest"/a/*.whl "$dest"/b/*.whl "$dest"/c/*.whl; do
  [ -f "$w" ] && [ "$(stat -c %s "$w")" -gt $((30 * 1024 * 1024)) ] || continue
  split -n 2 -d -a 1 "$w" "$w.tmp"
  mv "$w.tmp0" "$w.part-1-of-2" && mv "$w.tmp1" "$w.part-2-of-2" && rm "$w"
done
du -sh "$dest"/a "$dest"/b "$dest"/c
