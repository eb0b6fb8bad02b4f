#!/usr/bin/env bash
# One GPU call that checks the tensor-core matmul, logs under $OUT (default: gpu_check_out/): build,
# the matmul kernel tests under a time limit (a kernel that waits forever on a barrier must not eat
# the call), the tests of the LM head, the training step and GPT-2 (the matmul's users), then
# (with LLMC_SRC pointing at llm.c's sources) bench_gpt2, bench_matmul, and last the default
# translation run with seeds $SEEDS (default 0 1 2: BLEU under "highest" and its spread over seeds).
#   DATA_DIR=.data/multi30k [LLMC_SRC=.carry/llmc] [SEEDS="0 1"] bash scripts/gpu_check_matmul.sh
source "$(dirname "$0")/gpu_check_setup.sh"
# One aligned product first (the TMA path): a hang costs a minute, not the test step's four.
timeout -k 5 60 python -c "import numpy as np, minitorch
cuda = minitorch.TensorBackend(minitorch.CudaKernelOps)
a = minitorch.tensor_from_numpy(np.ones((256, 512), np.float32), backend=cuda)
print('smoke: ones(256, 512) @ ones(512, 256) =', (a @ a.permute(1, 0)).to_numpy()[0, 0], '(512 expected)')" \
  > "$OUT/smoke.log" 2>&1 || { echo "smoke product failed or hung (exit $?)"; tail -n 5 "$OUT/smoke.log"; exit 1; }
step smoke
timeout -k 10 240 python -m pytest -q -x kernel_tests/test_matmul.py > "$OUT/matmul_tests.log" 2>&1
code=$?; step matmul_tests
[ "$code" -eq 0 ] || { echo "matmul tests failed (exit $code): no benchmarks"; exit 1; }
timeout -k 10 240 python -m pytest -q kernel_tests/test_fused_loss.py kernel_tests/test_train_step.py \
  kernel_tests/test_gpt2.py > "$OUT/kernel_tests.log" 2>&1; step kernel_tests
if [ -n "${LLMC_SRC:-}" ]; then
  python benchmarks/bench_gpt2.py --llmc-src "$LLMC_SRC" --out "$OUT" > "$OUT/bench_gpt2.log" 2>&1; step bench_gpt2
fi
python benchmarks/bench_matmul.py --out "$OUT" > "$OUT/bench_matmul.log" 2>&1; step bench_matmul
for seed in ${SEEDS-0 1 2}; do
  python project/run_machine_translation.py --data-dir "$DATA_DIR" --out-dir "/tmp/mt_seed$seed" --seed "$seed" \
    > "$OUT/mt_seed$seed.log" 2>&1; echo "== mt_seed$seed: $(grep 'final evaluation' "$OUT/mt_seed$seed.log")"
done
