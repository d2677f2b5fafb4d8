#!/usr/bin/env bash
# Pack DeepGEMM's source at a pinned commit, with the CUTLASS and fmt headers its submodules pin,
# into .whl/dg/deepgemm-<commit>.tar.gz (git-ignored, ~3 MB), for the `deepgemm` stage of
# verify/gpu/run.sh, which builds it on the GPU machine and runs the checks on its fp8 scorers.
# The GPU machine has no network, and neither has this one to GitHub: point the script at local
# git mirrors of the three repositories (bare or not):
#
#   verify/gpu/fetch_deepgemm.sh DEEPGEMM_GIT CUTLASS_GIT FMT_GIT [COMMIT]
#
# COMMIT defaults to 54e2261 (DeepGEMM's main at the time of writing). The submodule commits are
# read from DeepGEMM's own tree at COMMIT, so CUTLASS and fmt always match what it pins.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,11p "$0" >&2; exit 2; }
dg=$1 cutlass=$2 fmt=$3 commit=${4:-54e2261}
cd "$(dirname "$0")/../.."
full=$(git -C "$dg" rev-parse --verify "$commit^{commit}") || { echo "DeepGEMM commit $commit not in $dg" >&2; exit 1; }
pin() { git -C "$dg" ls-tree "$full" "third-party/$1" | awk '$2 == "commit" {print $3}'; }
cutlass_pin=$(pin cutlass) fmt_pin=$(pin fmt)
[ -n "$cutlass_pin" ] && [ -n "$fmt_pin" ] || { echo "DeepGEMM $commit pins no cutlass/fmt submodule" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$work/deepgemm
mkdir -p "$src/third-party/cutlass" "$src/third-party/fmt"
git -C "$dg" archive "$full" | tar x -C "$src"
git -C "$cutlass" archive "$cutlass_pin" include | tar x -C "$src/third-party/cutlass" ||
  { echo "CUTLASS $cutlass_pin (DeepGEMM's pin) not in $cutlass" >&2; exit 1; }
git -C "$fmt" archive "$fmt_pin" include | tar x -C "$src/third-party/fmt" ||
  { echo "fmt $fmt_pin (DeepGEMM's pin) not in $fmt" >&2; exit 1; }
printf 'deepgemm %s\ncutlass %s\nfmt %s\n' "$full" "$cutlass_pin" "$fmt_pin" > "$src/BF16K_PINS"
mkdir -p .whl/dg
out=.whl/dg/deepgemm-${full:0:7}.tar.gz
tar czf "$out" -C "$work" deepgemm
echo "$out ($(du -h "$out" | cut -f1)): DeepGEMM ${full:0:12}, CUTLASS ${cutlass_pin:0:12}, fmt ${fmt_pin:0:12}"
