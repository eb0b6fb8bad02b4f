"""Data-parallel training on two GPUs (NCCL through torchrun): the same check as the CPU test,
every rank identical after every step and equal to one GPU training on the concatenated batches.
Skipped with fewer than two GPUs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_equal_one_gpu_on_the_concatenated_batches(tmp_path) -> None:
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "scripts" / "ddp_check.py")
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           script, "--backend", "cuda", "--out", str(tmp_path)]  # fmt: skip
    workers = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert workers.returncode == 0, workers.stdout + workers.stderr
    compare = [sys.executable, script, "--backend", "cuda", "--out", str(tmp_path), "--compare", "2", "--tolerance", "1e-4"]
    check = subprocess.run(compare, env=env, capture_output=True, text=True, timeout=300)
    print(check.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ranks identical" in check.stdout
