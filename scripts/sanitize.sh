#!/usr/bin/env bash
# Run the kernel tests' small cases (`pytest -m small`, chosen in kernel_tests/conftest.py) under
# compute-sanitizer memcheck, racecheck and initcheck: one process per (tool, kernel library), several
# at once, then a verdict table (also in OUT_DIR/summary.txt). Needs a GPU and built kernels.
#
#   bash scripts/sanitize.sh [OUT_DIR]          # default OUT_DIR: sanitize-logs
#
# Environment: SANITIZE_TOOLS (default "memcheck racecheck initcheck"), SANITIZE_LIBS (rows to run,
# default all: library names and mt_program_all_libs), SANITIZE_JOBS (processes at once, default: CPU
# count), SANITIZE_TIMEOUT (seconds per process, default 900), COMPUTE_SANITIZER
# (its path, default: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin). Every tensor gets its own
# cudaMalloc (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so memcheck sees an overrun past a tensor's end.
# Exit status 0 only when every cell of the table is clean.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/sanitize-logs}" && cd "${1:-$ROOT/sanitize-logs}" && pwd)"
TOOLS="${SANITIZE_TOOLS:-memcheck racecheck initcheck}"
JOBS="${SANITIZE_JOBS:-$(nproc)}"
TIMEOUT="${SANITIZE_TIMEOUT:-900}"

# The kernel tests that exercise each library (src/<library>.cu): test files (kernel_tests/) | pytest
# -k expression ("" for all of them). Every src/*.cu needs an entry: the rows of the table are the
# libraries found in src/, and a library without one (or an entry without a library) stops the run.
declare -A TESTS_OF=(
  [combine]="test_cuda_ops.py test_cuda_functions.py test_bf16_elementwise.py|not uniform and not embedding and not matmul"
  [random_kernel]="test_cuda_ops.py|uniform"
  [embedding_kernel]="test_cuda_ops.py test_cuda_functions.py test_decode_graphs.py test_bf16_embedding.py|embedding or gather_rows or gather_rounds or scatter_add"
  [matmul_kernel]="test_matmul.py test_cuda_ops.py|matmul"
  [matmul_bf16_kernel]="test_matmul_bf16.py|"
  [softmax_kernel]="test_softmax_fw.py test_softmax_bw.py test_bf16_softmax.py|"
  [layernorm_kernel]="test_layernorm_fw.py test_layernorm_bw.py test_bf16_layernorm.py|"
  [attention_kernel]="test_attention.py|"
  [attention_bf16_kernel]="test_bf16_attention.py|"
  [classifier_kernel]="test_fused_loss.py test_bf16_classifier.py|"
  [optimizer_kernel]="test_adamw.py test_bf16_adamw.py|"
  [kv_cache_kernel]="test_decode_graphs.py test_bf16_decoding.py|slot_write or slot_attention or write_slot"
  [topk_kernel]="test_decode_graphs.py|top_k_kernel"
  [beam_search_kernel]="test_decode_graphs.py|beam_search_step"
  [convert_kernel]="test_convert.py|"
  [int_kernel]="test_torch_habits_cuda.py|"
)
# Beyond the libraries, the translation program's few training steps, which drive them all.
PROGRAM_ROW="mt_program_all_libs|test_mt_resume_cuda.py|"

LIBRARY_TESTS=()
shopt -s nullglob
for src in "$ROOT"/src/*.cu; do
  lib="$(basename "$src" .cu)"
  if [[ -z "${TESTS_OF[$lib]+listed}" ]]; then
    echo "sanitize.sh: src/$lib.cu has no entry in TESTS_OF (scripts/sanitize.sh):" \
      "name the kernel tests that exercise it" >&2
    exit 2
  fi
  LIBRARY_TESTS+=("$lib|${TESTS_OF[$lib]}")
done
for lib in "${!TESTS_OF[@]}"; do
  if [[ ! -f "$ROOT/src/$lib.cu" ]]; then
    echo "sanitize.sh: TESTS_OF names $lib, but there is no src/$lib.cu" >&2
    exit 2
  fi
done
LIBRARY_TESTS+=("$PROGRAM_ROW")
if [[ -n "${SANITIZE_LIBS:-}" ]]; then
  CHOSEN=()
  for group in "${LIBRARY_TESTS[@]}"; do
    [[ " $SANITIZE_LIBS " == *" ${group%%|*} "* ]] && CHOSEN+=("$group")
  done
  (( ${#CHOSEN[@]} > 0 )) || { echo "sanitize.sh: SANITIZE_LIBS names no row: $SANITIZE_LIBS" >&2; exit 2; }
  LIBRARY_TESTS=("${CHOSEN[@]}")
fi

SANITIZER="${COMPUTE_SANITIZER:-}"
for candidate in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" \
    /usr/local/cuda/bin/compute-sanitizer; do
  [[ -z "$SANITIZER" && -x "$candidate" ]] && SANITIZER="$candidate"
done
if [[ -z "$SANITIZER" ]]; then
  echo "sanitize.sh: compute-sanitizer not found (install the CUDA toolkit or set COMPUTE_SANITIZER)" >&2
  exit 2
fi

# The verdicts are about this project's kernels, not PyTorch's own (the tests' references: cuDNN and
# flash attention, cuBLAS, ATen, Triton; cuDNN's SDPA backward reads memory it has not written, and
# initcheck does not see cuBLAS's stores, so PyTorch's copy of a torch.matmul result reads as
# uninitialized). Every kernel runs instrumented: leaving PyTorch's out (--kernel-name-exclude) made
# initcheck flag the outputs of the kernels it skipped and slowed it tenfold, and crashed racecheck
# ("failed to handle a hardware exception") in the bf16 matmul tests. Reports are told apart by the
# kernel they name instead (scripts/sanitizer_report.py, FOREIGN_KERNELS on demangled names), all of
# them printed (initcheck without host backtraces: thousands of PyTorch reports would take minutes).
FOREIGN_KERNELS='cudnn|at::native|cutlass|cublas|nvjet|gemm|xmma|fmha|flash|triton|sm80_|sm90_'

# Tests initcheck leaves out: there PyTorch's batched cuBLAS output, which the test's reference reads,
# gives ~600k reports (initcheck does not see cuBLAS's stores) and takes over 7 minutes; memcheck and
# racecheck run them, and the same kernels run under initcheck in the other bf16 matmul tests.
INITCHECK_DESELECT=(kernel_tests/test_matmul_bf16.py::test_batch_broadcast)

SANITIZER_HELP="$("$SANITIZER" --help 2>&1)"
offers() { [[ "$SANITIZER_HELP" == *"$1"* ]]; }  # whether this compute-sanitizer has the option

run_one() {  # tool library files k-expression
  local tool="$1" lib="$2" files="$3" kexpr="$4" extra=() paths=()
  offers --print-limit && extra+=(--print-limit 1000000)
  case "$tool" in
    memcheck) extra+=(--leak-check no --padding 512) ;;
    racecheck) extra+=(--racecheck-report analysis) ;;
    initcheck) offers --show-backtrace && extra+=(--show-backtrace device) ;;
  esac
  for f in $files; do paths+=("kernel_tests/$f"); done
  local args=(-q -p no:cacheprovider -m small "${paths[@]}")
  [[ -n "$kexpr" ]] && args+=(-k "$kexpr")
  if [[ "$tool" == initcheck ]]; then for test in "${INITCHECK_DESELECT[@]}"; do args+=(--deselect "$test"); done; fi
  (cd "$ROOT" && PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    timeout "$TIMEOUT" "$SANITIZER" --tool "$tool" "${extra[@]}" --log-file "$OUT/$tool.$lib.sanitizer.log" \
    python -m pytest "${args[@]}" > "$OUT/$tool.$lib.pytest.log" 2>&1)
  echo $? > "$OUT/$tool.$lib.status"
}

echo "sanitize.sh: $("$SANITIZER" --version | tail -n 1); tools: $TOOLS; $JOBS at once; logs in $OUT"
start=$SECONDS
for tool in $TOOLS; do
  for group in "${LIBRARY_TESTS[@]}"; do
    IFS="|" read -r lib files kexpr <<< "$group"
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
    run_one "$tool" "$lib" "$files" "$kexpr" &
  done
done
wait

count() {  # file pattern -> the sum of the numbers in the matches
  grep -hoE "$2" "$1" 2>/dev/null | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}'
}

verdict() {  # tool library -> one cell of the table
  local tool="$1" lib="$2" log="$OUT/$1.$2.sanitizer.log" status summary errors warnings
  status="$(cat "$OUT/$tool.$lib.status" 2>/dev/null || echo missing)"
  summary="$(grep -E '^[0-9]+ (passed|failed|skipped|deselected|error)|no tests ran' "$OUT/$tool.$lib.pytest.log" | tail -n 1)"
  summary="${summary%% in *}"
  [[ "$status" == 124 ]] && { echo "TIMEOUT after ${TIMEOUT}s"; return; }  # its log may be huge: not read
  # The reports naming this project's kernels (or none), and those in PyTorch's; racecheck's summary
  # "(N errors, M warnings)" gives the hazard warnings.
  read -r errors foreign < <(python3 "$ROOT/scripts/sanitizer_report.py" "$log" "$FOREIGN_KERNELS")
  warnings="$(count "$log" '[0-9]+ warnings?\)')"
  (( warnings > 0 )) && summary="$summary; $warnings hazard warnings"
  (( foreign > 0 )) && summary="$summary; $foreign in PyTorch's kernels"
  if (( errors > 0 )); then echo "${errors} ERRORS"
  elif [[ "$status" == 0 ]]; then echo "clean (${summary})"
  else echo "FAILED (exit $status: ${summary})"
  fi
}

{
  printf "%-20s" "library"; for tool in $TOOLS; do printf " | %-34s" "$tool"; done; printf "\n"
  for group in "${LIBRARY_TESTS[@]}"; do
    IFS="|" read -r lib files kexpr <<< "$group"
    printf "%-20s" "$lib"; for tool in $TOOLS; do printf " | %-34s" "$(verdict "$tool" "$lib")"; done; printf "\n"
  done
  echo "($((SECONDS - start))s; logs: $OUT/<tool>.<library>.{sanitizer,pytest}.log)"
} | tee "$OUT/summary.txt"
! grep -qE 'ERRORS|TIMEOUT|FAILED' "$OUT/summary.txt"
