#!/usr/bin/env bash
# Data parallelism on a host with 2 or more GPUs (the device tool's nvidia-h100-x2, or -x4), logs
# under $OUT (default: gpu_check_out/); one line of figures per log at the end. The parts, all by
# default or those named (each fits one device call of 10 minutes with the build; all four may not):
#   tests  kernel_tests/test_distributed_cuda.py (NCCL: ranks equal one GPU, overlap / phase /
#          micro-batches, ZeRO-1 equal to AdamW, the translation and GPT-2 programs on 1 vs 2 GPUs,
#          checkpoints resumed on another number of GPUs, two "nodes" launched apart, a killed rank)
#          and the gradient pack's tests
#   mt     the default translation run, the same command on 1 GPU and on all $GPUS (the global batch
#          stays 128): median step tokens/s, BLEU and wall time of each
#   gpt2   GPT-2 124M (fresh, random tokens, B 4 x T 1024 per GPU) on 1 GPU and on all, matmul
#          precisions "highest" and "high", all-reduce and --zero 1: the program's median ms/step
#   bench  benchmarks/bench_distributed.py on 1 GPU and on all (PyTorch DDP, TF32 and bf16, as the
#          peer; the overlap profile), then its --report table
#   DATA_DIR=.data/multi30k bash scripts/gpu_check_ddp.sh [tests] [mt] [gpt2] [bench]
source "$(dirname "$0")/gpu_check_setup.sh"
export NCCL_NVLS_ENABLE=0
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}
PARTS=${*:-tests mt gpt2 bench}
has() { [[ " $PARTS " == *" $1 "* ]]; }
# on N CMD...: CMD alone for one GPU, under torchrun on N
on() {
  local n=$1; shift
  if [ "$n" = 1 ]; then CUDA_VISIBLE_DEVICES=0 python "$@"; else torchrun --standalone --nproc_per_node "$n" "$@"; fi
}

if has tests; then
  python -m pytest -q kernel_tests/test_distributed_cuda.py kernel_tests/test_gradient_pack.py \
    kernel_tests/test_adamw.py > "$OUT/ddp_tests.log" 2>&1
  step ddp_tests "passed|failed|error"
fi

if has mt; then
  for n in 1 "$GPUS"; do
    start=$(date +%s)
    on "$n" project/run_machine_translation.py --data-dir "$DATA_DIR" --out-dir "/tmp/ddp_mt$n" > "$OUT/mt_${n}gpu.log" 2>&1
    echo "wall time $(( $(date +%s) - start )) s" >> "$OUT/mt_${n}gpu.log"
    step "mt_${n}gpu" "epoch 10:|final evaluation|wall time"
  done
fi

if has gpt2; then
  python -c "import numpy as np; from project.gpt2.llmc import write_shard
write_shard('/tmp/ddp_gpt2_train_000000.bin', np.random.default_rng(0).integers(0, 50257, 4 * 1024 * $GPUS * 40 + 1))"
  for precision in highest high; do
    for run in "1 0" "$GPUS 0" "$GPUS 1"; do
      set -- $run
      name="gpt2_${1}gpu_${precision}_zero$2"
      on "$1" project/train_gpt2.py --train-shards '/tmp/ddp_gpt2_train_*.bin' --batch-size $((4 * $1)) --steps 30 \
        --val-every 0 --grad-clip 1 --matmul-precision "$precision" --zero "$2" --out-dir "/tmp/$name" > "$OUT/$name.log" 2>&1
      step "$name" "processes|done:"
    done
  done
fi

if has bench; then
  rm -f "$OUT"/bench_distributed/world*.json
  for n in 1 "$GPUS"; do
    torchrun --standalone --nproc_per_node "$n" benchmarks/bench_distributed.py --out "$OUT/bench_distributed" \
      > "$OUT/bench_distributed_${n}gpu.log" 2>&1
    step "bench_distributed_${n}gpu" "ms/step|wrote"
  done
  python benchmarks/bench_distributed.py --report --out "$OUT/bench_distributed" > "$OUT/bench_distributed.log" 2>&1
  cat "$OUT/bench_distributed.log"
fi
