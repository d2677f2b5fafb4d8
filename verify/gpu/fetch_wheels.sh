#!/usr/bin/env bash
# Download, on a networked machine, exactly the wheels the GPU checks need on the (offline) GPU
# machine, into .whl/ (git-ignored; carried to the device with `carry: [".whl"]`).
# The GPU image has Python 3.12, torch, triton, numpy, matplotlib, but none of sglang's JIT
# loader dependencies. The pinned sglang wheel goes to .whl/upstream/ (it is not pip-installed
# there: `bf16k apply --wheel-file` builds sglang-upstream/ from it, exactly as on any machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
mkdir -p "$dest/upstream"
py=${PYTHON:-python3}
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64)
pkgs=(
  apache-tvm-ffi==0.1.11 msgspec orjson pybase64 starlette pyzmq pydantic pydantic_core annotated_types
  typing_inspection dill ipython decorator jedi parso matplotlib-inline pexpect prompt_toolkit stack_data
  traitlets wcwidth asttokens executing pure_eval ptyprocess ipython_pygments_lexers
  # importing the DSV4 pool / compressor modules: sglang 0.5.21's pins where the image differs
  compressed-tensors==0.18.0 loguru gguf transformers==5.12.1 tokenizers==0.22.2
  openai==2.6.1 jiter distro sniffio partial_json_parser
)
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${plat[@]}" -d "$dest" "${pkgs[@]}"
# The pinned upstream wheel, from the bf16k cache when `nox -s apply` already fetched it.
whl=$("$py" -c 'import tomllib;print(tomllib.load(open("pin.toml","rb"))["wheel"]["filename"])')
cache=${BF16K_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bf16k}/wheels/$whl
if [ -f "$cache" ]; then cp "$cache" "$dest/upstream/"; else
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --abi cp311 --platform manylinux_2_34_x86_64 -d "$dest/upstream" "sglang==${whl#sglang-}" 2>/dev/null ||
  { v=${whl#sglang-}; v=${v%%-*}; "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp --abi cp311 --platform manylinux_2_34_x86_64 -d "$dest/upstream" "sglang==$v"; }
fi
du -sh "$dest"
