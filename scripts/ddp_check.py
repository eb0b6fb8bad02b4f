"""Check that data-parallel training equals one process training on the whole batch.

Workers (one per rank, launched by torchrun) train a small DecoderLM for a few SGD steps with
minitorch.distributed.DistributedDataParallel in three modes: communication overlapped with backward
(overlap), sync_gradients() as a phase after it (sync), and each rank's rows split into micro-batches
whose gradients are accumulated in the buckets (accumulate: backward_round), saving their parameters
after every step.  Each rank starts from different random values (the wrapper broadcasts rank 0's),
takes its rows of every global batch with a different number of target tokens (gradient_weight =
its share), and in the last step only rank 0 has rows (the others run a copy with weight 0, as at the
end of an epoch).  The comparison then trains one process on the concatenated batches from rank 0's
start and requires every rank's parameters to equal rank 0's exactly and the single process's within
--tolerance, after every step.  (SGD, whose update is linear in the gradient: Adam would turn the
rounding noise of gradients that are zero in exact arithmetic, such as the key bias's, into
full-size steps.  SGD also replaces each parameter's tensor every step, which the hooks follow.)

ZeRO-1: the workers also train with AdamW (global-norm clipping on) twice, plainly (all-reduce) and
sharded (DistributedDataParallel(shard=True) + ShardedAdamW: reduce-scatter, each rank's shard of
the moments, all-gather); the comparison requires equal parameters after every step and equal
moments in the gathered state_dict, and a ShardedAdamW that loads the plain optimizer's state to
give it back.

    torchrun --standalone --nproc_per_node 2 scripts/ddp_check.py --backend simple --out DIR
    python scripts/ddp_check.py --backend simple --out DIR --compare 2

--capture-probe (CUDA) also tries to capture sync_gradients() (copies, NCCL all-reduce, stream
waits) in a CUDA graph and to replay it, and prints what happened.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import minitorch
from minitorch import distributed, nn

BACKENDS = {"simple": minitorch.SimpleOps, "fast": minitorch.FastOps, "cuda": minitorch.CudaKernelOps}
# Model and batch sizes: tiny for the pure-Python backend (CI), larger (several buckets of real
# size) on the GPU.
SIZES = {
    "simple": dict(n_vocab=13, n_embd=8, n_head=2, n_layers=1, seq=5, rows=2, bucket_cap_mb=0.001),
    "fast": dict(n_vocab=13, n_embd=8, n_head=2, n_layers=1, seq=5, rows=2, bucket_cap_mb=0.001),
    "cuda": dict(n_vocab=101, n_embd=64, n_head=4, n_layers=2, seq=16, rows=4, bucket_cap_mb=0.05),
}
MODES = ("overlap", "sync", "accumulate")
ADAM_MODES = ("adamw", "zero")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backend", choices=sorted(BACKENDS), default="simple")
    p.add_argument("--out", required=True, help="directory for the per-rank parameter files")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--compare", type=int, default=0, metavar="WORLD_SIZE",
                   help="train the single-process reference and compare with the files of this many ranks")
    p.add_argument("--tolerance", type=float, default=1e-5, help="max |rank - single| / max |single| per parameter")
    p.add_argument("--capture-probe", action="store_true", help="CUDA: try sync_gradients() inside a CUDA graph")
    return p


def make_model(backend_name: str, seed: int) -> minitorch.DecoderLM:
    size = SIZES[backend_name]
    minitorch.manual_seed(seed)
    return minitorch.DecoderLM(
        n_vocab=size["n_vocab"], n_embd=size["n_embd"], n_head=size["n_head"], n_positions=size["seq"],
        n_layers=size["n_layers"], p_dropout=0.0, backend=minitorch.TensorBackend(BACKENDS[backend_name]),
    )  # fmt: skip


def global_batches(backend_name: str, world_size: int, steps: int) -> Iterator[List[Tuple[np.ndarray, ...]]]:
    """Per step, one (tokens, targets, weights) per rank; the last step has rows for rank 0 only."""
    size = SIZES[backend_name]
    rng = np.random.default_rng(1234)
    for step in range(steps):
        ranks = 1 if step == steps - 1 else world_size
        batches = []
        for rank in range(ranks):
            tokens = rng.integers(0, size["n_vocab"], (size["rows"], size["seq"]))
            targets = rng.integers(0, size["n_vocab"], size["rows"] * size["seq"])
            weights = (rng.random(size["rows"] * size["seq"]) < 0.3 + 0.6 * rank / world_size).astype(np.float32)
            weights[:: size["seq"]] = 1.0  # every row has a target: a micro-batch of one row has a loss
            batches.append((tokens, targets, weights))
        yield batches


def loss_of(model: minitorch.DecoderLM, tokens: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> minitorch.Tensor:
    backend = model.lm_head.weight.value.backend
    logits = model(minitorch.tensor_from_numpy(tokens.astype(np.float32), backend=backend))
    B, T, V = logits.shape
    t = minitorch.tensor_from_numpy(targets.astype(np.float32), backend=backend)
    w = minitorch.tensor_from_numpy(weights, backend=backend)
    return nn.cross_entropy(logits.view(B * T, V), t, w)


def snapshot(model: minitorch.DecoderLM, prefix: str, into: Dict[str, np.ndarray]) -> None:
    for name, p in model.named_parameters():
        into[f"{prefix}/{name}"] = p.value.to_numpy()


def sgd_mode(args: argparse.Namespace, info: distributed.ProcessInfo, mode: str, saved: Dict[str, np.ndarray]) -> None:
    size = SIZES[args.backend]
    model = make_model(args.backend, seed=100 + info.rank)
    ddp = distributed.DistributedDataParallel(model, bucket_cap_mb=size["bucket_cap_mb"], overlap=mode != "sync")
    optimizer = minitorch.SGD(model.parameters(), lr=0.1, momentum=0.9)
    snapshot(model, f"{mode}/start", saved)
    for step, batches in enumerate(global_batches(args.backend, info.world_size, args.steps)):
        total = sum(float(w.sum()) for _, _, w in batches)
        mine = batches[info.rank] if info.rank < len(batches) else batches[0]
        share = float(mine[2].sum()) / total if info.rank < len(batches) else 0.0
        optimizer.zero_grad()
        if mode == "accumulate":
            ddp.gradient_weight = 1.0
            micro = list(micro_batches(mine))
            for i, (tokens, targets, weights) in enumerate(micro):
                with ddp.backward_round(accumulate=i > 0, reduce=i == len(micro) - 1):
                    (loss_of(model, tokens, targets, weights) * (share * float(weights.sum()) / float(mine[2].sum()))).backward()
        else:
            ddp.gradient_weight = share
            loss_of(model, *mine).backward()
            ddp.sync_gradients()
        optimizer.step()
        snapshot(model, f"{mode}/{step}", saved)
    print(f"rank {info.rank}: {mode} mode, {len(ddp.bucket_sizes)} buckets {ddp.bucket_sizes}", flush=True)
    ddp.close()


def micro_batches(batch: Tuple[np.ndarray, ...]) -> Iterator[Tuple[np.ndarray, ...]]:
    """A rank's rows one at a time."""
    tokens, targets, weights = batch
    seq = tokens.shape[1]
    for row in range(tokens.shape[0]):
        yield tokens[row : row + 1], targets[row * seq : (row + 1) * seq], weights[row * seq : (row + 1) * seq]


def adam_mode(args: argparse.Namespace, info: distributed.ProcessInfo, mode: str, saved: Dict[str, np.ndarray]) -> None:
    size = SIZES[args.backend]
    model = make_model(args.backend, seed=200 + info.rank)
    ddp = distributed.DistributedDataParallel(model, bucket_cap_mb=size["bucket_cap_mb"], shard=mode == "zero")
    # eps above the backward's rounding noise: the two runs' gradients differ by that noise (atomic
    # sums), and with eps = 1e-8 an element whose exact gradient is ~0 takes a step g / (|g| + eps)
    # that swings with it (2 x H100: 1.1e-4 relative in layers.0.ff.linear_in.weight from step 0)
    hyper = dict(lr=3e-3, weight_decay=0.1, max_grad_norm=1.0, eps=1e-6)
    optimizer = distributed.ShardedAdamW(ddp, **hyper) if mode == "zero" else minitorch.AdamW(model.parameters(), **hyper)
    for step, batches in enumerate(global_batches(args.backend, info.world_size, args.steps)):
        total = sum(float(w.sum()) for _, _, w in batches)
        mine = batches[info.rank] if info.rank < len(batches) else batches[0]
        ddp.gradient_weight = float(mine[2].sum()) / total if info.rank < len(batches) else 0.0
        optimizer.zero_grad()
        loss_of(model, *mine).backward()
        ddp.sync_gradients()
        optimizer.step()
        snapshot(model, f"{mode}/{step}", saved)
        saved[f"{mode}/norm/{step}"] = optimizer.grad_norm().to_numpy()
    state = optimizer.state_dict()
    for moment in ("m", "v"):
        for i, value in state[moment].items():
            saved[f"{mode}/state/{moment}/{i}"] = value
    if mode == "zero":
        plain = {moment: {int(k.split("/")[-1]): v for k, v in saved.items() if k.startswith(f"adamw/state/{moment}/")}
                 for moment in ("m", "v")}  # fmt: skip
        optimizer.load_state_dict({"t": optimizer.t, **plain})
        again = optimizer.state_dict()
        for moment in ("m", "v"):
            for i, value in again[moment].items():
                saved[f"zero/reloaded/{moment}/{i}"] = value
        print(f"rank {info.rank}: zero mode, {optimizer.state_floats:,} floats of AdamW state on this rank", flush=True)
    ddp.close()


def worker(args: argparse.Namespace) -> None:
    info = distributed.init_from_torchrun("cuda" if args.backend == "cuda" else "cpu")
    saved: Dict[str, np.ndarray] = {}
    for mode in MODES:
        sgd_mode(args, info, mode, saved)
    for mode in ADAM_MODES:
        adam_mode(args, info, mode, saved)
    np.savez(Path(args.out) / f"rank{info.rank}.npz", **saved)
    if args.capture_probe:
        capture_probe(args.backend, info)
    distributed.destroy_process_group()


def reference(args: argparse.Namespace) -> Dict[str, np.ndarray]:
    """One process, rank 0's start, each step's batches concatenated."""
    model = make_model(args.backend, seed=100)
    optimizer = minitorch.SGD(model.parameters(), lr=0.1, momentum=0.9)
    saved: Dict[str, np.ndarray] = {}
    snapshot(model, "start", saved)
    for step, batches in enumerate(global_batches(args.backend, args.compare, args.steps)):
        tokens, targets, weights = (np.concatenate(parts) for parts in zip(*batches))
        loss = loss_of(model, tokens, targets, weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        snapshot(model, str(step), saved)
    return saved


def compare(args: argparse.Namespace) -> int:
    single = reference(args)
    ranks = [dict(np.load(Path(args.out) / f"rank{r}.npz")) for r in range(args.compare)]
    failures = []
    worst = 0.0
    for key, want in single.items():
        for mode in MODES:
            main = ranks[0][f"{mode}/{key}"]
            for r in range(1, args.compare):
                if not np.array_equal(ranks[r][f"{mode}/{key}"], main):
                    failures.append(f"rank {r} differs from rank 0 at {mode}/{key}")
            error = relative(main, want)
            worst = max(worst, error)
            if error > args.tolerance:
                failures.append(f"{mode}/{key}: ranks differ from the single process by {error:.2e} (relative)")
    zero_worst = 0.0
    for key in (k for k in ranks[0] if k.startswith("adamw/")):
        for r in range(args.compare):
            for other in (key.replace("adamw/", "zero/", 1), key.replace("adamw/state/", "zero/reloaded/", 1)):
                if other not in ranks[r]:
                    continue
                error = relative(*(without_key_bias(key, ranks[r][k]) for k in (other, key)))
                zero_worst = max(zero_worst, error)
                if error > args.tolerance:
                    failures.append(f"rank {r}: {other} differs from {key} by {error:.2e} (relative)")
    print(f"compared {len(single)} parameter snapshots x {len(MODES)} modes on {args.compare} ranks: ranks "
          f"{'identical' if not any('differs from rank 0' in f for f in failures) else 'DIFFER'}, largest difference to one "
          f"process {worst:.2e}; ZeRO-1 against plain AdamW: largest difference {zero_worst:.2e} "
          f"(tolerance {args.tolerance:.0e})")  # fmt: skip
    for failure in failures[:20]:
        print("FAIL:", failure)
    return 1 if failures else 0


def without_key_bias(key: str, value: np.ndarray) -> np.ndarray:
    """value, with the key third of an attention's packed q/k/v bias (and its moments) zeroed.  That
    bias gets no gradient in exact arithmetic (softmax ignores a shift of all scores of a query), so
    Adam's steps there follow the rounding noise of the backward pass, which on the GPU (atomic sums)
    differs from one run to the next: the plain and the sharded run are compared without it."""
    if not key.endswith("attention.qkv_projection.bias"):
        return value
    third = value.shape[-1] // 3
    out = value.copy()
    out[..., third : 2 * third] = 0.0
    return out


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def capture_probe(backend_name: str, info: distributed.ProcessInfo) -> None:
    """Capture sync_gradients() of constant gradients (rank r: r + 1) in a CUDA graph, replay it with
    other values, and check the reduced sums."""
    import torch

    model = make_model(backend_name, seed=7)
    ddp = distributed.DistributedDataParallel(model, overlap=False)
    ddp.gradient_weight = 1.0
    grads = [p.value.zeros() for p in model.parameters()]

    def set_grads(value: float) -> None:
        for p, g in zip(model.parameters(), grads):
            g.copy_(value)
            p.value.grad = g

    set_grads(info.rank + 1.0)
    ddp.sync_gradients()  # warm-up outside the capture (creates the NCCL communicator)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        set_grads(info.rank + 1.0)
        with torch.cuda.graph(graph):
            ddp.sync_gradients()
        reduced = [p.value.grad for p in model.parameters()]  # views of the buckets
        set_grads(10.0 * (info.rank + 1.0))
        graph.replay()
        torch.cuda.synchronize()
        want = 10.0 * info.world_size * (info.world_size + 1) / 2
        got = np.unique(np.concatenate([g.to_numpy().ravel() for g in reduced]))
        verdict = "correct" if got.tolist() == [want] else f"WRONG (values {got[:5]}, expected {want})"
        print(f"rank {info.rank}: capture probe: sync_gradients captured and replayed: {verdict}", flush=True)
    except Exception as e:  # the answer to report, whatever torch/NCCL says
        print(f"rank {info.rank}: capture probe: capture failed: {type(e).__name__}: {e}", flush=True)
    finally:
        graph.reset()  # before destroy_process_group, which hangs while a graph holds NCCL work


def main() -> int:
    args = build_parser().parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.compare:
        return compare(args)
    worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
