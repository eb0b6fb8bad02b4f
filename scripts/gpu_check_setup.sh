# Sourced by the scripts/gpu_check*.sh calls: works from the repository root, sets $OUT (default
# gpu_check_out/, created) and $DATA_DIR (default ../shared/data/multi30k, made absolute) and the Python
# environment, builds the CUDA libraries (log in $OUT/build.log; the call stops if the build fails), and
# defines step, which reports a log.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-gpu_check_out}
DATA_DIR=$(realpath "${DATA_DIR:-../shared/data/multi30k}")
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
bash compile_cuda.sh > "$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
# step NAME [PATTERN]: report $OUT/NAME.log by its last line, or by its last 3 lines matching PATTERN.
step() {
  if [ $# -gt 1 ]; then echo "== $1:"; grep -E "$2" "$OUT/$1.log" | tail -n 3; else echo "== $1: $(tail -n 1 "$OUT/$1.log")"; fi
}
