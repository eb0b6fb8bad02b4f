#!/usr/bin/env bash
# Build every src/*.cu into minitorch/cuda_kernels/<name>.so (one shared library per source file),
# skipping the libraries that are up to date: built by the same nvcc, flags and architectures from
# the same content of their source and of the src/ headers it includes (a stamp beside each library,
# <name>.so.stamp; delete it to force a rebuild).
#
# Targets: the GPUs that nvidia-smi reports (machine code for their compute capability plus PTX);
# with no GPU (CI), sm_80 and sm_90 machine code plus compute_90 PTX. MINITORCH_CUDA_ARCH overrides
# both, as a list of compute capabilities: "90", "80;90", "8.0,9.0" or "sm_90". Compute capability
# 9.0 builds as sm_90a (Hopper's wgmma, which the matmul kernels use; it runs on 9.0 GPUs only),
# and the PTX for newer GPUs is the plain compute_XX of the highest target.
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
  [[ "$arch" == "90" ]] && arch="90a"
  GENCODE+=("-gencode=arch=compute_${arch},code=sm_${arch}")
done
HIGHEST="$(printf '%s\n' $ARCHS | tail -n 1 | sed 's/a$//')"
GENCODE+=("-gencode=arch=compute_${HIGHEST},code=compute_${HIGHEST}")  # PTX for newer GPUs

shopt -s nullglob
SOURCES=("$SRC_DIR"/*.cu)
[[ ${#SOURCES[@]} -gt 0 ]] || die "no CUDA sources in $SRC_DIR"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"

FLAGS=(-O3 -std=c++17 --threads 0 -shared -Xcompiler -fPIC -Xcompiler -Wall "${GENCODE[@]}")
NVCC_VERSION="$("$NVCC" --version | tail -n 2 | tr '\n' ' ')"

# A library's content stamp: the nvcc version, the flags (architectures included) and the content of
# its source and of every project header the source includes. <name>.so.stamp beside the library
# holds the stamp of the sources it was built from, then those files (one per line, the .cu first).
stamp_of() {  # files... -> the stamp
  { printf '%s\n' "$NVCC_VERSION" "${FLAGS[*]}"; (cd "$ROOT" && sha256sum "$@"); } | sha256sum | cut -d ' ' -f 1
}

# The source and the headers under src/ it includes (nvcc -MM; the toolkit's own headers change only
# with the nvcc version), as paths relative to the repository.
dependencies() {  # src
  local dep
  "$NVCC" -std=c++17 -MM "$1" | tr -d '\\' | tr ' ' '\n' | sed '/^$/d; /:$/d' | while read -r dep; do
    dep="$(realpath -m "$dep")"
    if [[ "$dep" == "$SRC_DIR"/* ]]; then printf '%s\n' "${dep#"$ROOT"/}"; fi
  done | awk '!seen[$0]++'
}

# Whether out (a library) was built from exactly the files its stamp lists, as they are now.
up_to_date() {  # out
  local stamp="$1.stamp" want files=()
  [[ -f "$1" && -f "$stamp" ]] || return 1
  want="$(head -n 1 "$stamp")"
  mapfile -t files < <(tail -n +2 "$stamp")
  (( ${#files[@]} > 0 )) || return 1
  (cd "$ROOT" && ls "${files[@]}" >/dev/null 2>&1) || return 1
  [[ "$(stamp_of "${files[@]}")" == "$want" ]]
}

mkdir -p "$OUT_DIR"
echo "compile_cuda.sh: architectures $(echo $ARCHS) ($ARCH_SOURCE)"
# One library per source, built in parallel (as many at once as there are cores). Each is built to a
# temporary name so a failed build never leaves a truncated library behind, and its stamp is written
# only after it built.
build_one() {
  local src="$1" name out tmp deps stamp
  name="$(basename "$src" .cu)"
  out="$OUT_DIR/$name.so"
  tmp="$out.tmp.$$"
  mapfile -t deps < <(dependencies "$src")
  (( ${#deps[@]} > 0 )) || { echo "compile_cuda.sh: error: no dependencies found for $src" >&2; return 1; }
  stamp="$(stamp_of "${deps[@]}")"
  echo "compile_cuda.sh: building $name"
  if ! "$NVCC" "${FLAGS[@]}" -o "$tmp" "$src"; then
    rm -f "$tmp"
    echo "compile_cuda.sh: error: building $src failed" >&2
    return 1
  fi
  printf '%s\n' "$stamp" "${deps[@]}" > "$tmp.stamp"
  mv -f "$tmp" "$out"
  mv -f "$tmp.stamp" "$out.stamp"
}
JOBS="$(nproc 2>/dev/null || echo 2)"
PIDS=()
SKIPPED=()
FAILED=0
for src in "${SOURCES[@]}"; do
  if up_to_date "$OUT_DIR/$(basename "$src" .cu).so"; then
    SKIPPED+=("$(basename "$src" .cu)")
    continue
  fi
  while (( $(jobs -rp | wc -l) >= JOBS )); do
    wait -n || FAILED=1
  done
  build_one "$src" &
  PIDS+=("$!")
done
for pid in "${PIDS[@]}"; do
  wait "$pid" || FAILED=1
done
(( ${#SKIPPED[@]} == 0 )) || echo "compile_cuda.sh: up to date, skipped: ${SKIPPED[*]}"
(( FAILED == 0 )) || die "some libraries failed to build (see above)"
echo "compile_cuda.sh: built ${#PIDS[@]} of ${#SOURCES[@]} libraries in $OUT_DIR"
