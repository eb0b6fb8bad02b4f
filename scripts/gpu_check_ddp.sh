#!/usr/bin/env bash
# One call on a host with 2 GPUs (the device tool's nvidia-h200-x2) that checks data parallelism,
# logs under $OUT (default: gpu_check_out/): build, the CUDA data-parallel tests (the 2-GPU
# equality among them), then the default translation run on one GPU and under torchrun on two,
# whose "median step" tokens/s and BLEU give the speed-up and the quality check.
#   DATA_DIR=.data/multi30k bash scripts/gpu_check_ddp.sh
source "$(dirname "$0")/gpu_check_setup.sh"
export NCCL_NVLS_ENABLE=0
python -m pytest -q kernel_tests/test_distributed_cuda.py kernel_tests/test_gradient_pack.py > "$OUT/ddp_tests.log" 2>&1
step ddp_tests "passed|failed|error"
RESULT="epoch 10:|final evaluation"
CUDA_VISIBLE_DEVICES=0 python project/run_machine_translation.py --data-dir "$DATA_DIR" --out-dir /tmp/ddp_mt1 \
  > "$OUT/mt_1gpu.log" 2>&1; step mt_1gpu "$RESULT"
torchrun --standalone --nproc_per_node 2 project/run_machine_translation.py --data-dir "$DATA_DIR" \
  --out-dir /tmp/ddp_mt2 > "$OUT/mt_2gpu.log" 2>&1; step mt_2gpu "$RESULT"
