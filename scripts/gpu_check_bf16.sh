#!/usr/bin/env bash
# The bf16 issues' measurements on one GPU, logs under $OUT (default: gpu_check_out/); the parts, all
# by default or those named (each fits one device call of 10 minutes with the build):
#   parity   benchmarks/gpt2_bf16_parity.py: 300 steps of GPT-2 124M in --dtype bf16 against PyTorch
#            autocast bf16 from the same weights and tokens (BPE of the Multi30k English text)
#   mt       the default translation run in bf16 and in fp32, one after the other: BLEU, median step
#            tokens/s and wall time of each (the bf16/fp32 speed ratio)
#   gpt2     bench_gpt2 at B 4 and B 16 (needs LLMC_SRC): minitorch bf16 against torch.compile bf16,
#            llm.c bf16 and PyTorch bf16 eager, with minitorch's TF32 and fp32-accurate steps in the
#            same run, then the profile of our bf16 step
#   matmul   bench_matmul's bf16 rows against torch.matmul (cuBLAS), then its K sweep (per-tile cost)
#   DATA_DIR=.data/multi30k [LLMC_SRC=.wt/llmc] bash scripts/gpu_check_bf16.sh [parity] [mt] [gpt2] [matmul]
source "$(dirname "$0")/gpu_check_setup.sh"
PARTS=${*:-parity mt gpt2 matmul}
has() { [[ " $PARTS " == *" $1 "* ]]; }

if has parity; then
  python benchmarks/gpt2_bf16_parity.py --corpus "$DATA_DIR/train.en.gz" --out "$OUT/parity" > "$OUT/parity.log" 2>&1
  step parity "mean loss of the last"
fi

if has mt; then
  for dtype in bf16 fp32; do
    start=$(date +%s)
    python project/run_machine_translation.py --data-dir "$DATA_DIR" --out-dir "/tmp/bf16_check_mt_$dtype" \
      --dtype "$dtype" > "$OUT/mt_$dtype.log" 2>&1
    echo "wall time $(( $(date +%s) - start )) s" >> "$OUT/mt_$dtype.log"
    step "mt_$dtype" "epoch 10:|final evaluation|wall time"
  done
fi

if has gpt2 && [ -n "${LLMC_SRC:-}" ]; then
  python benchmarks/bench_gpt2.py --llmc-src "$LLMC_SRC" --batch-sizes 4,16 --work /tmp/bf16_check_gpt2 --out "$OUT/gpt2" \
    --timeout 120 \
    --contenders "minitorch bf16,torch bf16 compile,llm.c bf16,torch bf16,minitorch all-fused tf32,minitorch all-fused" \
    > "$OUT/bench_gpt2.log" 2>&1
  step bench_gpt2 "minitorch|torch bf16|llm.c bf16"
  W=/tmp/bf16_check_gpt2/B4
  python benchmarks/profile_kernels.py --top 30 --out "$OUT/profile_bf16.json" -- project/train_gpt2.py \
    --backend cuda --init-from "$W/gpt2_124M.bin" --train-shards "$W/bench_train_*.bin" --batch-size 4 --steps 12 \
    --val-every 0 --out-dir /tmp/bf16_check_profile --use-fused-kernel true --attention fused --loss fused \
    --dtype bf16 > "$OUT/profile_bf16.log" 2>&1
  step profile_bf16 "kernels, "
fi

if has matmul; then
  python benchmarks/bench_matmul.py --dtypes bf16 --out "$OUT/matmul" > "$OUT/bench_matmul.log" 2>&1
  step bench_matmul
  python benchmarks/bench_matmul.py --dtypes bf16 --k-sweep --out "$OUT/matmul" > "$OUT/bench_matmul_k_sweep.log" 2>&1
  step bench_matmul_k_sweep "per K tile"
fi
