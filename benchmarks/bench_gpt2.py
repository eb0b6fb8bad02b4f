"""GPT-2 124M training, side by side: this project's program against llm.c and PyTorch.

Contenders, all from the same fresh GPT-2 124M checkpoint (GPT-2's initialisation, written by
project/gpt2_model.py) and the same token shards, batch 4 x 1024, AdamW (0.9, 0.999, eps 1e-8) at a
constant lr 3e-4, no weight decay, no clipping (llm.c's fp32 defaults), float32 throughout:

  llm.c fp32 / llm.c tf32      train_gpt2_fp32.cu built here from --llmc-src with nvcc -O3
                               --use_fast_math; TF32 off (a copy with ``enable_tf32 = 0``) and on
  torch fp32 / torch tf32      benchmarks/gpt2_torch_peer.py (eager, SDPA attention), TF32 off and on
  minitorch <variant>          project/train_gpt2.py --backend cuda with the variant's options; its
                               matmuls run in 3xTF32 (float32 accuracy) unless the variant says tf32
                               (--matmul-precision high, one TF32 product)

llm.c's DataLoader shuffles the training batches; both llm.c copies built here pass should_shuffle
0 to the training loader, so every contender reads the shard in order. Each contender runs alone
in its own process. Reported: ms/step (median of the steps after the first --skip), tokens/s, the
process's peak device memory (nvidia-smi's memory.used, sampled every 50 ms, minus the idle
reading before the run: tensors plus CUDA context and library workspaces), the allocator peak
(minitorch's and torch's peak of allocated tensors; llm.c: the sum of the buffers it reports
allocating) and the largest |loss difference| to llm.c fp32 over the steps.

Data: random tokens in [0, 50257) by default (fine for timing), or --corpus TEXT: a byte-level BPE
(8192 tokens, project/gpt2_data.py) trained on the text gives ids that a loss curve can learn.

Usage (on the GPU machine):
    python benchmarks/bench_gpt2.py --llmc-src ../llmc [--steps 20] [--corpus train.en.gz] [--out DIR]
Writes DIR/bench_gpt2.json and DIR/bench_gpt2.png (default DIR: benchmarks/results/bench_gpt2).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import ROOT, Column, Panel, Table, out_option, write_results
from project.gpt2.data import prepare_shards
from project.gpt2.model import gpt2_init_params
from project.gpt2.llmc import GPT2_124M, read_shard, write_checkpoint, write_shard

B, T, LR = 4, 1024, 3e-4
LLMC_PATCHES = {
    "shuffle off": ("dataloader_init(&train_loader, train_data_pattern, B, T, 0, 1, 1);",
                    "dataloader_init(&train_loader, train_data_pattern, B, T, 0, 1, 0);"),
    "tf32 off": ("int enable_tf32 = deviceProp.major >= 8 ? 1 : 0;", "int enable_tf32 = 0;"),
}  # fmt: skip
MINITORCH_VARIANTS = {
    "all-fused": ["--use-fused-kernel", "true", "--attention", "fused", "--loss", "fused"],
    "all-fused tf32": ["--use-fused-kernel", "true", "--attention", "fused", "--loss", "fused", "--matmul-precision", "high"],
    "fused-kernels": ["--use-fused-kernel", "true", "--attention", "naive", "--loss", "naive"],
}
LLMC_STEP = re.compile(r"step\s+(\d+)/\d+: train loss (\S+) \(([\d.]+) ms")
LLMC_ALLOC = re.compile(r"allocated (\d+) MiB for")


def prepare_data(work: Path, steps: int, corpus: str | None, seed: int) -> None:
    """work/gpt2_124M.bin (fresh init) and one train shard of steps*B*T+1 tokens (llm.c then runs
    exactly `steps` steps), one val shard of B*T+1 tokens."""
    write_checkpoint(work / "gpt2_124M.bin", GPT2_124M, gpt2_init_params(GPT2_124M, seed))
    need = steps * B * T + 1
    if corpus is None:
        rng = np.random.default_rng(seed)
        train, val = rng.integers(0, GPT2_124M.vocab_size, need), rng.integers(0, GPT2_124M.vocab_size, B * T + 1)
    else:
        data = prepare_shards(corpus, work / "corpus", vocab_size=8192, val_fraction=0.1, progress=False, overwrite=True)
        train = np.concatenate([read_shard(p) for p, _ in data.train_shards])
        val = np.concatenate([read_shard(p) for p, _ in data.val_shards])
        if train.size < need or val.size < B * T + 1:
            raise SystemExit(f"--corpus {corpus} gives {train.size} train / {val.size} val tokens; need {need} / {B * T + 1}")
    write_shard(work / "bench_train_000000.bin", train[:need])
    write_shard(work / "bench_val_000000.bin", val[: B * T + 1])


def build_llmc(src: Path, work: Path) -> dict[str, Path]:
    """Two patched copies of llm.c (shuffle off; TF32 off or left on), built in parallel."""
    builds, binaries = [], {}
    for name, patches in (("llmc_fp32", ("shuffle off", "tf32 off")), ("llmc_tf32", ("shuffle off",))):
        folder = work / name
        shutil.copytree(src, folder, dirs_exist_ok=True)
        source = (folder / "train_gpt2_fp32.cu").read_text()
        for patch in patches:
            old, new = LLMC_PATCHES[patch]
            if source.count(old) != 1:
                raise SystemExit(f"{src}/train_gpt2_fp32.cu: expected the line {old!r} once for '{patch}'")
            source = source.replace(old, new)
        (folder / "train_gpt2_fp32.cu").write_text(source)
        cmd = ["nvcc", "-O3", "--use_fast_math", "-std=c++17", "train_gpt2_fp32.cu", "-lcublas", "-lcublasLt", "-o", name]
        builds.append((name, subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        binaries[name] = folder / name
    for name, proc in builds:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"building {name} failed:\n{out}")
    return binaries


def gpu_memory_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def run_measured(cmd: list[str], cwd: Path, log: Path, timeout: float) -> tuple[str, float]:
    """Run cmd alone; (its stdout+stderr, peak nvidia-smi memory.used above the idle reading, MiB)."""
    idle, peak, done = gpu_memory_used_mib(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], gpu_memory_used_mib())
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    finally:
        done.set()
        sampler.join()
    log.write_text(proc.stdout)
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed (exit {proc.returncode}); last output:\n{proc.stdout[-3000:]}")
    return proc.stdout, float(peak[0] - idle)


def run_llmc(binary: Path, work: Path, steps: int, timeout: float) -> dict[str, Any]:
    cmd = [str(binary), "-i", str(work / "bench_train_*.bin"), "-j", str(work / "bench_val_*.bin"), "-b", str(B),
           "-t", str(T), "-l", str(LR), "-v", "100000", "-m", "1", "-s", "100000", "-g", "2"]  # fmt: skip
    out, device_mib = run_measured(cmd, work, work / f"{binary.name}.log", timeout)
    rows = [(int(s), float(loss), float(ms)) for s, loss, ms in LLMC_STEP.findall(out)]
    if [r[0] for r in rows] != list(range(1, steps + 1)):
        raise SystemExit(f"{binary.name}: expected steps 1..{steps} in its output, got {[r[0] for r in rows]}")
    allocated = sum(int(m) for m in LLMC_ALLOC.findall(out))
    return {"losses": [r[1] for r in rows], "ms": [r[2] for r in rows], "device_mib": device_mib,
            "allocator_peak_mib": float(allocated)}  # fmt: skip


def run_torch(work: Path, steps: int, tf32: bool, timeout: float) -> dict[str, Any]:
    name = f"torch_{'tf32' if tf32 else 'fp32'}"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpt2_torch_peer.py"), "--init-from", str(work / "gpt2_124M.bin"),
           "--train-shards", str(work / "bench_train_*.bin"), "--steps", str(steps), "--lr", str(LR),
           "--tf32", str(tf32).lower(), "--out", str(work / f"{name}.json")]  # fmt: skip
    _, device_mib = run_measured(cmd, ROOT, work / f"{name}.log", timeout)
    return {**json.loads((work / f"{name}.json").read_text()), "device_mib": device_mib}


def run_minitorch(work: Path, steps: int, variant: str, timeout: float) -> dict[str, Any]:
    out_dir = work / f"minitorch_{variant.replace(' ', '_')}"
    cmd = [sys.executable, str(ROOT / "project" / "train_gpt2.py"), "--backend", "cuda",
           "--init-from", str(work / "gpt2_124M.bin"), "--train-shards", str(work / "bench_train_*.bin"),
           "--batch-size", str(B), "--seq-len", str(T), "--steps", str(steps), "--lr", str(LR), "--weight-decay", "0",
           "--grad-clip", "0", "--val-every", "0", "--out-dir", str(out_dir), *MINITORCH_VARIANTS[variant]]  # fmt: skip
    _, device_mib = run_measured(cmd, ROOT, out_dir.with_suffix(".log"), timeout)
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "loss" in r]
    peak = next(r["peak_memory_mb"] for r in records if "peak_memory_mb" in r)
    return {"losses": [r["loss"] for r in steps_], "ms": [r["ms"] for r in steps_], "device_mib": device_mib,
            "allocator_peak_mib": peak}  # fmt: skip


def summarize(results: dict[str, dict[str, Any]], skip: int) -> None:
    """Add ms_per_step, tokens_per_s and max_loss_diff (to llm.c fp32) to every contender."""
    for r in results.values():
        r["ms_per_step"] = statistics.median(r["ms"][skip:])
        r["tokens_per_s"] = B * T / (r["ms_per_step"] / 1e3)
    reference = results["llm.c fp32"]
    for r in results.values():
        r["max_loss_diff"] = float(np.max(np.abs(np.array(r["losses"]) - np.array(reference["losses"]))))
        r["vs_llmc_fp32"] = reference["ms_per_step"] / r["ms_per_step"]


def panels(results: dict[str, dict[str, Any]]) -> list[Panel]:
    """Loss per step, its distance to llm.c fp32's, and the median step time of every contender."""
    names = list(results)
    colors = [f"C{i}" for i in range(len(names))]
    reference = np.array(results["llm.c fp32"]["losses"])
    steps = list(range(1, len(reference) + 1))
    others = [n for n in names if n != "llm.c fp32"]
    diffs = {n: np.maximum(np.abs(np.array(results[n]["losses"]) - reference), 1e-8).tolist() for n in others}
    return [
        Panel(steps, {n: results[n]["losses"] for n in names}, kind="lines", colors=colors, xlabel="step",
              ylabel="train loss", title="loss per step"),
        Panel(steps, diffs, kind="lines", colors=[colors[names.index(n)] for n in others], log=True, xlabel="step",
              ylabel="|loss - llm.c fp32 loss|", title="agreement with llm.c fp32"),
        Panel(names, {"ms per step": [results[n]["ms_per_step"] for n in names]}, kind="barh", colors=colors,
              xlabel="ms per step (median)", title="step time, B 4 x T 1024"),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llmc-src", required=True, help="folder with llm.c's train_gpt2_fp32.cu and llmc/")
    p.add_argument("--steps", type=int, default=20, help="training steps per contender (llm.c: one pass over the shard)")
    p.add_argument("--skip", type=int, default=3, help="first steps left out of the median (warm-up, allocation)")
    p.add_argument("--corpus", default=None, help="text file to tokenize instead of random tokens")
    p.add_argument("--variants", default=",".join(MINITORCH_VARIANTS),
                   help=f"comma-separated minitorch variants from {list(MINITORCH_VARIANTS)}")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each contender may run")
    p.add_argument("--seed", type=int, default=0)
    out_option(p, "bench_gpt2")
    args = p.parse_args(argv)
    if args.steps <= args.skip:
        p.error(f"--steps {args.steps} must exceed --skip {args.skip}")

    import torch

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_gpt2_"))
    work.mkdir(parents=True, exist_ok=True)
    prepare_data(work, args.steps, args.corpus, args.seed)
    binaries = build_llmc(Path(args.llmc_src), work)
    results: dict[str, dict[str, Any]] = {
        "llm.c fp32": run_llmc(binaries["llmc_fp32"], work, args.steps, args.timeout),
        "llm.c tf32": run_llmc(binaries["llmc_tf32"], work, args.steps, args.timeout),
        "torch fp32": run_torch(work, args.steps, False, args.timeout),
        "torch tf32": run_torch(work, args.steps, True, args.timeout),
    }
    for variant in filter(None, args.variants.split(",")):
        results[f"minitorch {variant}"] = run_minitorch(work, args.steps, variant, args.timeout)
        print(f"ran minitorch {variant}: {statistics.median(results[f'minitorch {variant}']['ms'][args.skip:]):.1f} ms/step", flush=True)
    summarize(results, args.skip)

    device = torch.cuda.get_device_name()
    data = "random tokens" if args.corpus is None else f"BPE-8192 tokens of {Path(args.corpus).name}"
    print(f"GPT-2 124M, B {B} x T {T}, {args.steps} steps ({data}), {device}; median of steps {args.skip + 1}..{args.steps}")
    table = Table(
        Column("contender", 24, "contender", left=True),
        Column("ms/step", 9, "ms_per_step", ".1f"),
        Column("tokens/s", 9, "tokens_per_s", ",.0f"),
        Column("llm.c fp32/x", 12, "vs_llmc_fp32", ".2f", "x"),
        Column("device MiB", 11, "device_mib", ",.0f"),
        Column("alloc MiB", 10, "allocator_peak_mib", ",.0f"),
        Column("loss 1", 9, lambda r: r["losses"][0], ".4f"),
        Column(f"loss {args.steps}", 9, lambda r: r["losses"][-1], ".4f"),
        Column("max|dloss|", 11, "max_loss_diff", ".2e"),
    )
    table.header()
    for name, r in results.items():
        table.row({"contender": name, **r})
    report = {"device": device, "torch": torch.__version__, "batch": B, "seq_len": T, "lr": LR, "steps": args.steps,
              "skip": args.skip, "data": data, "llmc_patches": {k: v[1] for k, v in LLMC_PATCHES.items()},
              "contenders": results}  # fmt: skip
    write_results(args.out, "bench_gpt2", report, panels(results), size=(16, 4.5),
                  title=f"GPT-2 124M training on {device} (float32; {data})")
    return report


if __name__ == "__main__":
    main()
