#!/usr/bin/env bash
# One GPU call that checks a checkout end to end, logs under $OUT (default: gpu_check_out/):
# build, the kernel tests, the translation recipe that reaches BLEU >= 35, decoding speed on that
# run, and (with LLMC_SRC pointing at llm.c's sources) the GPT-2 step against llm.c and PyTorch.
#   DATA_DIR=.data/multi30k [LLMC_SRC=.carry/llmc] bash scripts/gpu_check.sh
source "$(dirname "$0")/gpu_check_setup.sh"
python -m pytest -q kernel_tests > "$OUT/kernel_tests.log" 2>&1; step kernel_tests
python project/run_machine_translation.py --data-dir "$DATA_DIR" --out-dir /tmp/gpu_check_mt --epochs 24 \
  --dropout 0.2 --label-smoothing 0.1 --average-last 5 > "$OUT/mt_24ep.log" 2>&1; step mt_24ep
python benchmarks/bench_decode.py --run /tmp/gpu_check_mt --data-dir "$DATA_DIR" --out "$OUT" > "$OUT/bench_decode.log" 2>&1
step bench_decode
if [ -n "${LLMC_SRC:-}" ]; then
  python benchmarks/bench_gpt2.py --llmc-src "$LLMC_SRC" --out "$OUT" > "$OUT/bench_gpt2.log" 2>&1; step bench_gpt2
fi
