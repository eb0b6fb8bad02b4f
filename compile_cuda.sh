#!/usr/bin/env bash
# Build every src/*.cu into minitorch/cuda_kernels/<name>.so (one shared library per source file).
#
# Targets: the GPUs that nvidia-smi reports (machine code for their compute capability plus PTX);
# with no GPU (CI), sm_80 and sm_90 machine code plus compute_90 PTX. MINITORCH_CUDA_ARCH overrides
# both, as a list of compute capabilities: "90", "80;90", "8.0,9.0" or "sm_90".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC_DIR="$ROOT/src"
OUT_DIR="$ROOT/minitorch/cuda_kernels"
NVCC="${NVCC:-nvcc}"

die() {
  echo "compile_cuda.sh: error: $*" >&2
  exit 1
}

command -v "$NVCC" >/dev/null 2>&1 || die "nvcc not found (install the CUDA toolkit or set NVCC=/path/to/nvcc)"

# Normalize "8.0", "sm_80", "80" to "80"; one per line, sorted, unique.
normalize_archs() {
  tr ';, ' '\n\n\n' | sed -e 's/^sm_//' -e 's/^compute_//' -e 's/\.//' | sed '/^$/d' | sort -un
}

if [[ -n "${MINITORCH_CUDA_ARCH:-}" ]]; then
  ARCHS="$(printf '%s' "$MINITORCH_CUDA_ARCH" | normalize_archs)"
  ARCH_SOURCE="MINITORCH_CUDA_ARCH=$MINITORCH_CUDA_ARCH"
elif command -v nvidia-smi >/dev/null 2>&1 &&
  CAPS="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null)" && [[ -n "$CAPS" ]]; then
  ARCHS="$(printf '%s' "$CAPS" | normalize_archs)"
  ARCH_SOURCE="nvidia-smi"
else
  ARCHS="$(printf '80;90' | normalize_archs)"
  ARCH_SOURCE="no GPU found: default list"
fi

[[ -n "$ARCHS" ]] || die "no CUDA architecture to build for ($ARCH_SOURCE)"
GENCODE=()
for arch in $ARCHS; do
  [[ "$arch" =~ ^[0-9]+[a-z]?$ ]] || die "bad CUDA architecture '$arch' ($ARCH_SOURCE); expected e.g. 90 or 80;90"
  GENCODE+=("-gencode=arch=compute_${arch},code=sm_${arch}")
done
HIGHEST="$(printf '%s\n' $ARCHS | tail -n 1)"
GENCODE+=("-gencode=arch=compute_${HIGHEST},code=compute_${HIGHEST}")  # PTX for newer GPUs

shopt -s nullglob
SOURCES=("$SRC_DIR"/*.cu)
[[ ${#SOURCES[@]} -gt 0 ]] || die "no CUDA sources in $SRC_DIR"

mkdir -p "$OUT_DIR"
echo "compile_cuda.sh: architectures $(echo $ARCHS) ($ARCH_SOURCE)"
for src in "${SOURCES[@]}"; do
  name="$(basename "$src" .cu)"
  out="$OUT_DIR/$name.so"
  tmp="$out.tmp.$$"
  echo "compile_cuda.sh: $src -> $out"
  # Build to a temporary name so a failed build never leaves a truncated library behind.
  # --threads 0: the per-architecture passes of one file run in parallel.
  if ! "$NVCC" -O3 -std=c++17 --threads 0 -shared -Xcompiler -fPIC -Xcompiler -Wall "${GENCODE[@]}" \
      -o "$tmp" "$src"; then
    rm -f "$tmp"
    die "building $src failed"
  fi
  mv -f "$tmp" "$out"
done
echo "compile_cuda.sh: built ${#SOURCES[@]} libraries in $OUT_DIR"
