#!/usr/bin/env bash
# Set up this checkout on a machine of either kind: PyTorch, the requirements, minitorch itself
# (editable) and, where an NVIDIA GPU and nvcc are, the CUDA kernels.
#
# PyTorch (minitorch's device-memory and stream provider, and the tests' reference):
#   - an installed torch is kept as it is, CPU or CUDA build;
#   - on a machine with a GPU (nvidia-smi lists one) without torch: pip's default build, the CUDA one;
#   - on a machine without a GPU: a CPU build, never the multi-GB CUDA one. From PyTorch's CPU index
#     (download.pytorch.org/whl/cpu) where it answers; where it does not (an offline mirror, such as
#     this project's development machines, whose pip index serves the CPU build), pip's configured
#     index is asked for $MINITORCH_CPU_TORCH (default torch==2.13.0). The result is checked to be a
#     CPU build.
#
#   bash scripts/setup.sh             # what the README's commands run
#   bash scripts/setup.sh --dry-run   # print the decisions and commands, change nothing
#
# MINITORCH_BUILD_KERNELS=1 builds the kernels without a GPU too (CI checks that the sources
# compile), =0 never; PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}
CPU_INDEX=https://download.pytorch.org/whl/cpu
CPU_TORCH=${MINITORCH_CPU_TORCH:-torch==2.13.0}
DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1

say() { echo "setup: $*"; }
run() {
  say "$*"
  [[ $DRY_RUN == 1 ]] || "$@"
}
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
torch_build() { "$PYTHON" -c 'import torch; print(("cuda " + torch.version.cuda) if torch.version.cuda else "cpu")' 2>/dev/null || true; }
cpu_index_answers() {
  "$PYTHON" -c "import urllib.request; urllib.request.urlopen('$CPU_INDEX/torch/', timeout=5)" >/dev/null 2>&1
}

installed=$(torch_build)
if [[ -n "$installed" ]]; then
  say "keeping the installed torch ($installed build)"
elif has_gpu; then
  say "a GPU is here and torch is not: installing pip's default (CUDA) build"
  run "$PYTHON" -m pip install -q "torch>=2.1"
elif cpu_index_answers; then
  say "no GPU here: installing torch's CPU build from $CPU_INDEX"
  run "$PYTHON" -m pip install -q torch --index-url "$CPU_INDEX"
else
  say "no GPU here and $CPU_INDEX does not answer: installing $CPU_TORCH from pip's configured index"
  run "$PYTHON" -m pip install -q "$CPU_TORCH"
fi
if [[ $DRY_RUN == 0 && -z "$installed" ]] && ! has_gpu && [[ "$(torch_build)" != cpu ]]; then
  say "error: the torch just installed is not a CPU build ($(torch_build)); on this machine install one by hand" >&2
  exit 1
fi

run "$PYTHON" -m pip install -q -r requirements.txt
run "$PYTHON" -m pip install -q -e . --no-deps

build=${MINITORCH_BUILD_KERNELS:-}
if [[ -z "$build" ]]; then
  if ! has_gpu; then
    build=0
    say "no GPU here: the CUDA kernels are not built (the CPU backend needs none; bash compile_cuda.sh builds them)"
  elif ! command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
    build=0
    say "a GPU but no nvcc here: install the CUDA toolkit, then bash compile_cuda.sh (until then programs train on the CPU)"
  else
    build=1
  fi
fi
if [[ $build == 1 ]]; then
  run bash compile_cuda.sh
fi
say "done"
