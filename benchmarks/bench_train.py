"""Training-speed benchmark: the translation program's DecoderLM trained for N steps three ways.

  minitorch unfused    no fused kernel: composed softmax and LayerNorm, Adam from elementwise ops
  minitorch fused      the LightSeq2 kernels (attention softmax, LayerNorm) and the fused AdamW kernel
  minitorch all fused  also fused attention (no [T, T] scores) and the fused linear cross-entropy
  torch eager          the same architecture written in PyTorch below (fp32, TF32 off, torch Adam)

All three train on the same random token batches of the program's shape (batch 128, T tokens,
vocab 8000), with token-weighted cross-entropy and Adam, reading the loss every step as the program
does. Reported: tokens/s (median step time after warm-up), peak GPU memory of a step, and for the
minitorch paths a profile of one step: GPU kernel time (CUPTI, through torch.profiler) against the
step's wall time; the difference is host time the GPU waits on (Python, autodiff, launches).

The "program" rows time the translation program's own step function (CUDA graphs, multi-tensor
clip + AdamW, no host read per step) over real Multi30k batches against a PyTorch eager loop of the
same model with the same clipping and AdamW (see program_rows).

Usage: python benchmarks/bench_train.py [--steps N] [--seq-len T] [--data-dir DIR] [--out DIR]
Writes DIR/bench_train.json and DIR/bench_train.png (default DIR: benchmarks/results/bench_train).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any, Callable, Dict, List

import numpy as np

from common import Column, Panel, Table, out_option, wall_clock, write_results
import minitorch
from minitorch import DecoderLM, nn
from profile_kernels import kernel_rows

CONFIG = dict(n_vocab=8000, n_embd=256, n_head=8, n_layers=4, batch=128)


def make_batches(n: int, seq_len: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """Random token batches with the program's layout: ids, next-token targets, per-token weights
    (the last third of each sequence, standing in for the English side)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = rng.integers(3, CONFIG["n_vocab"], size=(CONFIG["batch"], seq_len)).astype(np.float32)
        targets = np.roll(tokens, -1, axis=1)
        weights = np.zeros_like(tokens)
        weights[:, seq_len // 3 : seq_len - 1] = 1.0
        out.append(dict(tokens=tokens, targets=targets, weights=weights))
    return out


def minitorch_trainer(level: int, seq_len: int) -> Callable[[Dict[str, np.ndarray]], float]:
    """level 0: unfused; 1: fused softmax, LayerNorm and AdamW; 2: also fused attention and loss."""
    backend = minitorch.TensorBackend(minitorch.CudaKernelOps)
    minitorch.manual_seed(0)
    model = DecoderLM(
        CONFIG["n_vocab"], CONFIG["n_embd"], CONFIG["n_head"], seq_len, n_layers=CONFIG["n_layers"],
        p_dropout=0.1, backend=backend, use_fused_kernel=level >= 1, attention="fused" if level >= 2 else "naive",
    )
    opt = minitorch.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0) if level >= 1 else minitorch.Adam(model.parameters(), lr=1e-3)

    def step(batch: Dict[str, np.ndarray]) -> float:
        tokens = minitorch.tensor_from_numpy(batch["tokens"], backend=backend)
        targets = minitorch.tensor_from_numpy(batch["targets"].reshape(-1), backend=backend)
        weights = minitorch.tensor_from_numpy(batch["weights"].reshape(-1), backend=backend)
        if level >= 2:
            hidden = model.hidden_states(tokens)
            B, T, C = hidden.shape
            head = model.lm_head
            loss = minitorch.fused_linear_cross_entropy(
                hidden.view(B * T, C), head.weight.value.T, targets, weights, bias=head.bias.value
            )
        else:
            logits = model(tokens)
            B, T, V = logits.shape
            loss = nn.cross_entropy(logits.view(B * T, V), targets, weights)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def torch_model(torch: Any, seq_len: int) -> Any:
    """The benchmark's DecoderLM architecture in PyTorch (fp32, pre-LN, tanh GELU, dropout 0.1), seeded, on
    the CPU (.cuda() moves it)."""
    F = torch.nn.functional
    C, H, V = CONFIG["n_embd"], CONFIG["n_head"], CONFIG["n_vocab"]

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
            self.q, self.k, self.v, self.o = (torch.nn.Linear(C, C) for _ in range(4))
            self.ff_in, self.ff_out = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x: Any, causal: Any) -> Any:
            B, T, _ = x.shape
            h = self.ln_1(x)
            q = (self.q(h) / math.sqrt(C // H)).view(B, T, H, -1).transpose(1, 2)
            k = self.k(h).view(B, T, H, -1).transpose(1, 2)
            v = self.v(h).view(B, T, H, -1).transpose(1, 2)
            probs = torch.softmax(q @ k.transpose(-1, -2) + causal, dim=-1)
            x = x + self.drop(self.o((probs @ v).transpose(1, 2).reshape(B, T, C)))
            return x + self.drop(self.ff_out(F.gelu(self.ff_in(self.ln_2(x)), approximate="tanh")))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(V, C), torch.nn.Embedding(seq_len, C)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(CONFIG["n_layers"]))
            self.ln, self.head, self.drop = torch.nn.LayerNorm(C), torch.nn.Linear(C, V), torch.nn.Dropout(0.1)

        def forward(self, idx: Any) -> Any:
            T = idx.shape[1]
            causal = torch.full((T, T), float("-inf"), device=idx.device).triu(1)
            x = self.drop(self.tok(idx) + self.pos(torch.arange(T, device=idx.device)))
            for layer in self.layers:
                x = layer(x, causal)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return Model()


def torch_trainer(torch: Any, seq_len: int) -> Callable[[Dict[str, np.ndarray]], float]:
    F = torch.nn.functional
    V = CONFIG["n_vocab"]
    model = torch_model(torch, seq_len).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(batch: Dict[str, np.ndarray]) -> float:
        tokens = torch.from_numpy(batch["tokens"]).long().cuda()
        targets = torch.from_numpy(batch["targets"].reshape(-1)).long().cuda()
        weights = torch.from_numpy(batch["weights"].reshape(-1)).cuda()
        logits = model(tokens)
        loss = (F.cross_entropy(logits.view(-1, V), targets, reduction="none") * weights).sum() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def measure(torch: Any, step: Callable[[Dict[str, np.ndarray]], float], batches: List[Dict[str, np.ndarray]], warmup: int) -> Dict[str, Any]:
    """Median wall time per step (each step ends by reading the loss, a synchronization) and the
    step's peak GPU memory; losses are returned to show the run trains."""
    losses = [step(b) for b in batches[:warmup]]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    timed = iter(batches[warmup:])
    clock = wall_clock(lambda: step(next(timed)), len(batches) - warmup)
    return dict(step_s=clock.median, peak_bytes=torch.cuda.max_memory_allocated(), losses=losses + clock.results)


def profile_step(torch: Any, step: Callable[[Dict[str, np.ndarray]], float], batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
    """GPU kernel time, kernel count and wall time of one step, from torch.profiler (CUPTI sees
    our ctypes-launched kernels as well as torch's)."""
    from torch.profiler import ProfilerActivity, profile

    step(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step(batch)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    rows = kernel_rows(prof)
    kernel_s = sum(r["total_us"] for r in rows) / 1e6
    top = [(r["kernel"], r["total_us"] / 1e6) for r in rows[:8]]
    launches = sum(r["launches"] for r in rows)
    return dict(wall_s=wall, kernel_s=kernel_s, kernels=launches, gpu_busy=kernel_s / wall, top_kernels=top)


def program_rows(torch: Any, data_dir: str, epochs: int) -> Dict[str, Any]:
    """The translation program's own step (project/mt_steps.TrainStep: CUDA graphs, multi-tensor
    clip + AdamW, loss summed on the device) on the program's real batches (Multi30k, bucketed widths,
    batch 128), against a PyTorch eager loop of the same model with the same clipping (1.0) and
    AdamW, also without a host read per step.  One warm-up epoch (graph captures, torch's caching),
    then `epochs` timed epochs: ms/step and tokens/s over the wall time, synchronized at the end."""
    from project import translation as mt_data
    from project.translation.step import TranslationStep as TrainStep
    from project.translation.model import count_tokens

    corpus = mt_data.load_corpus(data_dir)
    tokenizer = mt_data.train_tokenizer(corpus.train, CONFIG["n_vocab"])
    train = mt_data.encode_pairs(tokenizer, corpus.train, 128)
    batcher = mt_data.Batcher(train.sequences, CONFIG["batch"], seed=0)
    epochs_batches = [list(batcher.epoch()) for _ in range(1 + epochs)]
    timed = [b for batches in epochs_batches[1:] for b in batches]
    tokens = sum(count_tokens(b) for b in timed)
    rows: Dict[str, Any] = {}

    cuda = minitorch.TensorBackend(minitorch.CudaKernelOps)
    minitorch.manual_seed(0)
    model = DecoderLM(n_vocab=tokenizer.get_vocab_size(), n_embd=CONFIG["n_embd"], n_head=CONFIG["n_head"],
                      n_positions=128, n_layers=CONFIG["n_layers"], p_dropout=0.1, backend=cuda, use_fused_kernel=True)
    opt = minitorch.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, max_grad_norm=1.0)
    step = TrainStep(model, opt, cuda, "naive", use_graphs=True, graph_batch_size=CONFIG["batch"])
    for b in epochs_batches[0]:
        step(b, 1e-3)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in timed:
        step(b, 1e-3)
    step.loss_total()
    rows["minitorch program step"] = dict(seconds=time.perf_counter() - t0, graphs=step.captured)

    F = torch.nn.functional
    tmodel = torch_model(torch, 128).cuda()
    topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-3, weight_decay=0.01)
    total = torch.zeros((), device="cuda")

    def torch_step(b: Any) -> None:
        nonlocal total
        tokens_t = torch.from_numpy(b.tokens).cuda(non_blocking=True)
        targets = torch.from_numpy(b.targets.reshape(-1)).cuda(non_blocking=True)
        weights = torch.from_numpy(b.weights.reshape(-1)).cuda(non_blocking=True)
        logits = tmodel(tokens_t)
        loss = (F.cross_entropy(logits.view(-1, logits.shape[-1]), targets, reduction="none") * weights).sum() / weights.sum()
        topt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 1.0)
        topt.step()
        total = total + loss.detach() * weights.sum()

    for b in epochs_batches[0]:
        torch_step(b)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in timed:
        torch_step(b)
    total.item()
    rows["torch eager loop"] = dict(seconds=time.perf_counter() - t0)
    for r in rows.values():
        r["ms_per_step"] = 1e3 * r["seconds"] / len(timed)
        r["tokens_per_s"] = tokens / r["seconds"]
    rows["ratio"] = rows["minitorch program step"]["tokens_per_s"] / rows["torch eager loop"]["tokens_per_s"]
    rows["steps"], rows["tokens"] = len(timed), tokens
    return rows


TABLE = Table(  # rows: a path's results and its name under "path"
    Column("path", 20, "path", left=True),
    Column("step ms", 9, lambda r: 1e3 * r["step_s"], ".1f"),
    Column("tokens/s", 10, "tokens_per_s", ".0f"),
    Column("peak MiB", 9, lambda r: r["peak_bytes"] / 2**20, ".0f"),
    Column("kernels", 8, lambda r: r["profile"]["kernels"], "d"),
    Column("kernel ms", 10, lambda r: 1e3 * r["profile"]["kernel_s"], ".1f"),
    Column("GPU busy", 9, lambda r: 100 * r["profile"]["gpu_busy"], ".0f", "%"),
    Column("loss first->last", 16, lambda r: f"{r['losses'][0]:.3f}->{r['losses'][-1]:.3f}", left=True),
)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per path (after warm-up)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=48, help="tokens per sequence (Multi30k pairs average ~40)")
    out_option(parser, "bench_train")
    parser.add_argument("--data-dir", default=None,
                        help="Multi30k directory for the program row (default: the program's default)")
    parser.add_argument("--program-epochs", type=int, default=1, help="timed epochs of the program row (0: skip it)")
    args = parser.parse_args(argv)

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    batches = make_batches(args.warmup + args.steps, args.seq_len, seed=1)
    tokens_per_step = CONFIG["batch"] * args.seq_len
    results: Dict[str, Any] = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, config=CONFIG,
                                   seq_len=args.seq_len, steps=args.steps, paths={})
    paths = {
        "minitorch unfused": lambda: minitorch_trainer(0, args.seq_len),
        "minitorch fused": lambda: minitorch_trainer(1, args.seq_len),
        "minitorch all fused": lambda: minitorch_trainer(2, args.seq_len),
        "torch eager": lambda: torch_trainer(torch, args.seq_len),
    }
    for name, make in paths.items():
        torch.cuda.empty_cache()
        step = make()
        r = measure(torch, step, batches, args.warmup)
        r["tokens_per_s"] = tokens_per_step / r["step_s"]
        r["profile"] = profile_step(torch, step, batches[0])
        results["paths"][name] = r
        del step

    p = results["paths"]
    results["fused_vs_unfused"] = p["minitorch fused"]["tokens_per_s"] / p["minitorch unfused"]["tokens_per_s"]
    results["fused_vs_torch"] = p["minitorch fused"]["tokens_per_s"] / p["torch eager"]["tokens_per_s"]
    results["all_fused_vs_unfused"] = p["minitorch all fused"]["tokens_per_s"] / p["minitorch unfused"]["tokens_per_s"]
    results["all_fused_vs_torch"] = p["minitorch all fused"]["tokens_per_s"] / p["torch eager"]["tokens_per_s"]

    print(f"{results['device']}  torch {results['torch']}  fp32  batch {CONFIG['batch']} x T {args.seq_len}, "
          f"n_embd {CONFIG['n_embd']}, {CONFIG['n_layers']} layers, vocab {CONFIG['n_vocab']}; median of {args.steps} steps")
    TABLE.header()
    for name, r in p.items():
        TABLE.row({"path": name, **r})
    print(f"fused / unfused = {results['fused_vs_unfused']:.2f}x   fused / torch eager = {results['fused_vs_torch']:.2f}x   "
          f"all fused / unfused = {results['all_fused_vs_unfused']:.2f}x   all fused / torch eager = {results['all_fused_vs_torch']:.2f}x")
    for name, r in p.items():
        print(f"top kernels of one step, {name}: " + ", ".join(f"{n[:40]} {1e3 * s:.2f} ms" for n, s in r["profile"]["top_kernels"][:5]))

    if args.program_epochs > 0:
        from project import translation as mt_data

        results["program"] = pr = program_rows(torch, args.data_dir or str(mt_data.DEFAULT_DATA_DIR), args.program_epochs)
        print(f"program row: real Multi30k batches, {pr['steps']} steps, {pr['tokens']} tokens after a warm-up epoch")
        for name in ("minitorch program step", "torch eager loop"):
            r = pr[name]
            print(f"{name:24s} {r['ms_per_step']:8.2f} ms/step {r['tokens_per_s']:10.0f} tokens/s")
        print(f"program step / torch eager loop = {pr['ratio']:.2f}x")

    write_results(args.out, "bench_train", results, panels(results),
                  title=f"DecoderLM training on {results['device']} (fp32)", size=(15, 4.5))


def panels(results: Dict[str, Any]) -> List[Panel]:
    """Throughput, peak memory, and a step's kernel time against its host time, per path."""
    names = list(results["paths"])
    r = [results["paths"][n] for n in names]
    colors = ["tab:gray", "tab:blue", "tab:purple", "tab:orange"]
    kernel_ms = [1e3 * x["profile"]["kernel_s"] for x in r]
    host_ms = [1e3 * (x["profile"]["wall_s"] - x["profile"]["kernel_s"]) for x in r]
    return [
        Panel(names, {"tokens / s": [x["tokens_per_s"] for x in r]}, colors=colors, ylabel="tokens / s",
              title="training throughput"),
        Panel(names, {"peak MiB": [x["peak_bytes"] / 2**20 for x in r]}, colors=colors,
              ylabel="peak GPU memory (MiB)", title="peak memory of a step"),
        Panel(names, {"GPU kernels": kernel_ms, "GPU idle (host work)": host_ms}, kind="stacked",
              colors=["tab:green", "tab:red"], ylabel="ms per step", title="where a step's time goes"),
    ]


if __name__ == "__main__":
    main()
