"""GPT-2 124M training, side by side: this project's program against llm.c and PyTorch, in float32 and bf16.

Contenders, all from the same fresh GPT-2 124M checkpoint (GPT-2's initialisation, llm.c's format)
and the same token shards, T 1024, AdamW (0.9, 0.999, eps 1e-8) at a constant lr 3e-4, no weight
decay, no clipping (llm.c's fp32 defaults; llm.c's bf16 trainer keeps its own 0.95 and clip 1):

  llm.c fp32 / llm.c tf32      train_gpt2_fp32.cu built here from --llmc-src with nvcc -O3
                               --use_fast_math; TF32 off (a copy with ``enable_tf32 = 0``) and on
  llm.c bf16                   train_gpt2.cu (bf16, float32 master weights, no cuDNN) built with
                               -DENABLE_BF16; from the bfloat16 (version 5) copy of the checkpoint
  torch fp32 / torch tf32      benchmarks/gpt2_torch_peer.py (eager, SDPA attention), TF32 off and on
  torch bf16                   the same under torch.autocast(bfloat16), eager
  torch bf16 compile           autocast + torch.compile + SDPA (flash) + fused AdamW: PyTorch's best
  torch bf16 compile graphs    the same with torch.compile(mode="reduce-overhead"): the compiled forward
                               and backward replayed as CUDA graphs (at B 4 the default mode's step can
                               be bound by the host's launches)
  minitorch <variant>          project/train_gpt2.py --backend cuda with the variant's options: float32
                               (3xTF32 matmuls, or TF32 in the tf32 variant) or --dtype bf16

llm.c's DataLoader shuffles the training batches; every llm.c copy built here reads the shard in
order, as the others do. With CUDA 13 llm.c's cudaMemAdvise(..., cudaCpuDeviceId) takes a
cudaMemLocation: the copy built here is patched so. Each contender runs alone in its own process, at
each --batch-sizes (B 4 and B 16: the gap to the tensor-core limit shrinks with batch). Reported:
ms/step (median of the steps after the first --skip), tokens/s, MFU (flops per token 6 N + 6 L C T,
llm.c's count, against 989 TFLOP/s, the H100's dense bf16 peak), the speed against torch bf16 compile,
the process's peak device memory (nvidia-smi's memory.used, sampled every 50 ms, minus the idle
reading before the run: tensors plus CUDA context and library workspaces), the allocator peak
(minitorch's and torch's peak of allocated tensors; llm.c: the sum of the buffers it reports
allocating) and the largest |loss difference| to llm.c fp32 over the steps.

Data: random tokens in [0, 50257) by default (fine for timing), or --corpus TEXT: a byte-level BPE
(8192 tokens, project/gpt2_data.py) trained on the text gives ids that a loss curve can learn.

Usage (on the GPU machine):
    python benchmarks/bench_gpt2.py --llmc-src ../llmc [--steps 20] [--batch-sizes 4,16] [--corpus train.en.gz] [--out DIR]
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
from project.gpt2.llmc import GPT2_124M, num_parameters, read_shard, write_checkpoint, write_shard
from project.gpt2.model import gpt2_init_params

T, LR = 1024, 3e-4
PEAK_TFLOPS = 989.0  # H100 SXM dense bf16
FLOPS_PER_TOKEN = 6 * num_parameters(GPT2_124M) + 6 * GPT2_124M.num_layers * GPT2_124M.channels * T
LLMC_PATCHES = {  # name: (file, line, replacement)
    "fp32 shuffle off": ("train_gpt2_fp32.cu", "dataloader_init(&train_loader, train_data_pattern, B, T, 0, 1, 1);",
                         "dataloader_init(&train_loader, train_data_pattern, B, T, 0, 1, 0);"),
    "tf32 off": ("train_gpt2_fp32.cu", "int enable_tf32 = deviceProp.major >= 8 ? 1 : 0;", "int enable_tf32 = 0;"),
    "bf16 shuffle off": ("train_gpt2.cu", "int permute_train_loader = (overfit_single_batch == 1) ? 0 : 1;",
                         "int permute_train_loader = 0;"),
    "CUDA 13 cudaMemAdvise": ("llmc/cuda_utils.cuh", "cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)",
                              "cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})"),
}  # fmt: skip
LLMC_BUILDS = {  # binary: (source, patches, nvcc options, libraries beyond cuBLAS)
    "llmc_fp32": ("train_gpt2_fp32.cu", ("fp32 shuffle off", "tf32 off"), (), ()),
    "llmc_tf32": ("train_gpt2_fp32.cu", ("fp32 shuffle off",), (), ()),
    "llmc_bf16": ("train_gpt2.cu", ("bf16 shuffle off",), ("-t=0", "-DENABLE_BF16"), ("-lnvidia-ml",)),
}
ALL_FUSED = ["--use-fused-kernel", "true", "--attention", "fused", "--loss", "fused"]
CONTENDERS = {  # name: (kind, binary or extra arguments)
    "llm.c fp32": ("llmc", "llmc_fp32"),
    "llm.c tf32": ("llmc", "llmc_tf32"),
    "llm.c bf16": ("llmc", "llmc_bf16"),
    "torch fp32": ("torch", ["--tf32", "false"]),
    "torch tf32": ("torch", ["--tf32", "true"]),
    "torch bf16": ("torch", ["--dtype", "bf16"]),
    "torch bf16 compile": ("torch", ["--dtype", "bf16", "--compile", "true", "--fused-adamw", "true"]),
    "torch bf16 compile graphs": ("torch", ["--dtype", "bf16", "--compile", "true", "--compile-mode", "reduce-overhead",
                                            "--fused-adamw", "true"]),
    "minitorch all-fused": ("minitorch", ALL_FUSED),
    "minitorch all-fused tf32": ("minitorch", [*ALL_FUSED, "--matmul-precision", "high"]),
    "minitorch fused-kernels": ("minitorch", ["--use-fused-kernel", "true", "--attention", "naive", "--loss", "naive"]),
    "minitorch bf16": ("minitorch", [*ALL_FUSED, "--dtype", "bf16"]),
    "minitorch bf16 eager": ("minitorch", [*ALL_FUSED, "--dtype", "bf16", "--cuda-graphs", "false"]),
}
LLMC_STEP = {
    "llmc_fp32": re.compile(r"step\s+(\d+)/\d+: train loss (\S+) \(([\d.]+) ms"),
    "llmc_bf16": re.compile(r"step\s+(\d+)/\d+ \| loss (\S+) .*?\| ([\d.]+) ms \|"),
}
LLMC_ALLOC = re.compile(r"allocat(?:ed|ing) (\d+) MiB for")


def prepare_data(work: Path, steps: int, batch: int, corpus: str | None, seed: int) -> None:
    """work/gpt2_124M.bin (fresh init) and its bfloat16 copy gpt2_124M_bf16.bin, one train shard of
    steps*B*T+1 tokens (llm.c's fp32 trainer then runs exactly `steps` steps), one val shard of
    B*T+1 tokens."""
    params = gpt2_init_params(GPT2_124M, seed)
    write_checkpoint(work / "gpt2_124M.bin", GPT2_124M, params)
    write_checkpoint(work / "gpt2_124M_bf16.bin", GPT2_124M, params, dtype="bfloat16")
    need = steps * batch * T + 1
    if corpus is None:
        rng = np.random.default_rng(seed)
        train, val = rng.integers(0, GPT2_124M.vocab_size, need), rng.integers(0, GPT2_124M.vocab_size, batch * T + 1)
    else:
        data = prepare_shards(corpus, work / "corpus", vocab_size=8192, val_fraction=0.1, progress=False, overwrite=True)
        train = np.concatenate([read_shard(p) for p, _ in data.train_shards])
        val = np.concatenate([read_shard(p) for p, _ in data.val_shards])
        if train.size < need or val.size < batch * T + 1:
            raise SystemExit(f"--corpus {corpus} gives {train.size} train / {val.size} val tokens; need {need} / {batch * T + 1}")
    write_shard(work / "bench_train_000000.bin", train[:need])
    write_shard(work / "bench_val_000000.bin", val[: batch * T + 1])


def cuda_major() -> int:
    """The major version of the nvcc on PATH."""
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"release (\d+)\.", out).group(1))


def build_llmc(src: Path, work: Path, wanted: set[str]) -> dict[str, Path]:
    """The wanted llm.c binaries, each built in parallel from its patched copy of src."""
    builds, binaries = [], {}
    for name in sorted(wanted):
        source, patches, options, libraries = LLMC_BUILDS[name]
        if source == "train_gpt2.cu" and cuda_major() >= 13:
            patches = (*patches, "CUDA 13 cudaMemAdvise")
        folder = work / name
        shutil.copytree(src, folder, dirs_exist_ok=True)
        for patch in patches:
            file, old, new = LLMC_PATCHES[patch]
            text = (folder / file).read_text()
            if text.count(old) != 1:
                raise SystemExit(f"{src}/{file}: expected the text {old!r} once for '{patch}'")
            (folder / file).write_text(text.replace(old, new))
        cmd = ["nvcc", "-O3", *options, "--use_fast_math", "-std=c++17", source, "-lcublas", "-lcublasLt", *libraries,
               "-o", name]  # fmt: skip
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


def run_llmc(binary: Path, work: Path, batch: int, steps: int, timeout: float) -> dict[str, Any]:
    bf16 = binary.name == "llmc_bf16"
    cmd = [str(binary), "-i", str(work / "bench_train_*.bin"), "-j", str(work / "bench_val_*.bin"), "-b", str(batch),
           "-t", str(T), "-l", str(LR), "-v", "100000", "-m", "1", "-s", "100000", "-g", "2"]  # fmt: skip
    if bf16:
        cmd += ["-e", str(work / "gpt2_124M_bf16.bin"), "-x", str(steps)]
    out, device_mib = run_measured(cmd, work, work / f"{binary.name}.log", timeout)
    rows = [(int(s), float(loss), float(ms)) for s, loss, ms in LLMC_STEP["llmc_bf16" if bf16 else "llmc_fp32"].findall(out)]
    if [r[0] for r in rows] != list(range(1, steps + 1)):
        raise SystemExit(f"{binary.name}: expected steps 1..{steps} in its output, got {[r[0] for r in rows]}")
    allocated = sum(int(m) for m in LLMC_ALLOC.findall(out))
    return {"losses": [r[1] for r in rows], "ms": [r[2] for r in rows], "device_mib": device_mib,
            "allocator_peak_mib": float(allocated)}  # fmt: skip


def run_torch(work: Path, batch: int, steps: int, name: str, extra: list[str], timeout: float) -> dict[str, Any]:
    out = work / f"{name.replace(' ', '_')}.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpt2_torch_peer.py"), "--init-from", str(work / "gpt2_124M.bin"),
           "--train-shards", str(work / "bench_train_*.bin"), "--batch-size", str(batch), "--seq-len", str(T),
           "--steps", str(steps), "--lr", str(LR), *extra, "--out", str(out)]  # fmt: skip
    _, device_mib = run_measured(cmd, ROOT, out.with_suffix(".log"), timeout)
    return {**json.loads(out.read_text()), "device_mib": device_mib}


def run_minitorch(work: Path, batch: int, steps: int, name: str, extra: list[str], timeout: float) -> dict[str, Any]:
    out_dir = work / name.replace(" ", "_")
    cmd = [sys.executable, str(ROOT / "project" / "train_gpt2.py"), "--backend", "cuda",
           "--init-from", str(work / "gpt2_124M.bin"), "--train-shards", str(work / "bench_train_*.bin"),
           "--batch-size", str(batch), "--seq-len", str(T), "--steps", str(steps), "--lr", str(LR), "--weight-decay", "0",
           "--grad-clip", "0", "--val-every", "0", "--out-dir", str(out_dir), *extra]  # fmt: skip
    _, device_mib = run_measured(cmd, ROOT, out_dir.with_suffix(".log"), timeout)
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "loss" in r]
    peak = next(r["peak_memory_mb"] for r in records if "peak_memory_mb" in r)
    return {"losses": [r["loss"] for r in steps_], "ms": [r["ms"] for r in steps_], "device_mib": device_mib,
            "allocator_peak_mib": peak}  # fmt: skip


def summarize(results: dict[str, dict[str, Any]], batch: int, skip: int) -> None:
    """Add ms_per_step, tokens_per_s, mfu, the speed against torch bf16 compile and llm.c fp32, and
    max_loss_diff (to llm.c fp32) to every contender of one batch size."""
    for r in results.values():
        r["ms_per_step"] = statistics.median(r["ms"][skip:])
        r["tokens_per_s"] = batch * T / (r["ms_per_step"] / 1e3)
        r["mfu"] = FLOPS_PER_TOKEN * r["tokens_per_s"] / (PEAK_TFLOPS * 1e12)
    for key, reference in (("vs_torch_compile", "torch bf16 compile"), ("vs_llmc_fp32", "llm.c fp32")):
        if reference in results:
            for r in results.values():
                r[key] = results[reference]["ms_per_step"] / r["ms_per_step"]
    if "llm.c fp32" in results:
        reference_losses = np.array(results["llm.c fp32"]["losses"])
        for r in results.values():
            r["max_loss_diff"] = float(np.max(np.abs(np.array(r["losses"]) - reference_losses)))


def panels(by_batch: dict[int, dict[str, dict[str, Any]]]) -> list[Panel]:
    """Loss per step at the first batch size, then the median step time of every contender at each."""
    first = by_batch[min(by_batch)]
    names = list(first)
    colors = {n: f"C{i}" for i, n in enumerate(CONTENDERS)}
    steps = list(range(1, len(first[names[0]]["losses"]) + 1))
    out = [Panel(steps, {n: first[n]["losses"] for n in names}, kind="lines", colors=[colors[n] for n in names],
                 xlabel="step", ylabel="train loss", title=f"loss per step, B {min(by_batch)}")]  # fmt: skip
    for batch, results in by_batch.items():
        out.append(Panel(list(results), {"ms per step": [r["ms_per_step"] for r in results.values()]}, kind="barh",
                         colors=[colors[n] for n in results], notes=[f"{r['mfu']:.0%} MFU" for r in results.values()],
                         xlabel="ms per step (median)", title=f"step time, B {batch} x T {T}"))  # fmt: skip
    return out


def run_contender(name: str, work: Path, batch: int, args: argparse.Namespace, binaries: dict[str, Path]) -> dict[str, Any]:
    kind, what = CONTENDERS[name]
    if kind == "llmc":
        return run_llmc(binaries[what], work, batch, args.steps, args.timeout)
    runner = run_torch if kind == "torch" else run_minitorch
    return runner(work, batch, args.steps, name, what, args.timeout)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llmc-src", required=True, help="folder with llm.c's train_gpt2_fp32.cu, train_gpt2.cu and llmc/")
    p.add_argument("--steps", type=int, default=20, help="training steps per contender")
    p.add_argument("--skip", type=int, default=3, help="first steps left out of the median (warm-up, allocation)")
    p.add_argument("--batch-sizes", default="4,16", help="comma-separated batch sizes B, each run by every contender")
    p.add_argument("--corpus", default=None, help="text file to tokenize instead of random tokens")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated, of {list(CONTENDERS)}")
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each contender may run")
    p.add_argument("--seed", type=int, default=0)
    out_option(p, "bench_gpt2")
    args = p.parse_args(argv)
    if args.steps <= args.skip:
        p.error(f"--steps {args.steps} must exceed --skip {args.skip}")
    names = [n for n in args.contenders.split(",") if n]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or not names:
        p.error(f"--contenders: unknown {unknown}; choose from {list(CONTENDERS)}")
    batches = [int(b) for b in args.batch_sizes.split(",") if b]

    import torch

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_gpt2_"))
    work.mkdir(parents=True, exist_ok=True)
    binaries = build_llmc(Path(args.llmc_src), work, {CONTENDERS[n][1] for n in names if CONTENDERS[n][0] == "llmc"})
    by_batch: dict[int, dict[str, dict[str, Any]]] = {}
    for batch in batches:
        folder = work / f"B{batch}"
        folder.mkdir(exist_ok=True)
        prepare_data(folder, args.steps, batch, args.corpus, args.seed)
        results = by_batch[batch] = {}
        for name in names:
            results[name] = run_contender(name, folder, batch, args, binaries)
            print(f"ran {name} at B {batch}: {statistics.median(results[name]['ms'][args.skip:]):.1f} ms/step", flush=True)
        summarize(results, batch, args.skip)

    device = torch.cuda.get_device_name()
    data = "random tokens" if args.corpus is None else f"BPE-8192 tokens of {Path(args.corpus).name}"
    table = Table(
        Column("contender", 24, "contender", left=True), Column("ms/step", 9, "ms_per_step", ".1f"),
        Column("tokens/s", 9, "tokens_per_s", ",.0f"), Column("MFU", 6, lambda r: 100 * r["mfu"], ".1f", "%"),
        Column("tc/x", 6, "vs_torch_compile", ".2f", "x"), Column("llm.c fp32/x", 12, "vs_llmc_fp32", ".2f", "x"),
        Column("device MiB", 11, "device_mib", ",.0f"), Column("alloc MiB", 10, "allocator_peak_mib", ",.0f"),
        Column("loss 1", 9, lambda r: r["losses"][0], ".4f"), Column(f"loss {args.steps}", 9, lambda r: r["losses"][-1], ".4f"),
        Column("max|dloss|", 11, "max_loss_diff", ".2e"),
    )  # fmt: skip
    for batch, results in by_batch.items():
        print(f"\nGPT-2 124M, B {batch} x T {T}, {args.steps} steps ({data}), {device}; median of steps "
              f"{args.skip + 1}..{args.steps}; MFU against {PEAK_TFLOPS:.0f} TFLOP/s; tc/x: torch bf16 compile's ms / this")  # fmt: skip
        table.header()
        for name, r in results.items():
            table.row({"contender": name, **r})
    report = {"device": device, "torch": torch.__version__, "seq_len": T, "lr": LR, "steps": args.steps, "skip": args.skip,
              "data": data, "peak_tflops": PEAK_TFLOPS, "flops_per_token": FLOPS_PER_TOKEN,
              "llmc_patches": {k: v[2] for k, v in LLMC_PATCHES.items()},
              "batches": {str(b): results for b, results in by_batch.items()}}  # fmt: skip
    write_results(args.out, "bench_gpt2", report, panels(by_batch), size=(7 * (1 + len(by_batch)), 5.5),
                  title=f"GPT-2 124M training on {device} ({data})")
    return report


if __name__ == "__main__":
    main()
