"""Both training programs' data-parallel code on tiny models, for the tests that compare world sizes.

translation: the translation program's run (project/translation/run.py: TranslationRun, its
parallel steps, micro-batches, ZeRO-1, checkpoints, the watchdog) trains a tiny DecoderLM on
generated sequences, epoch after epoch as main() does but without the evaluation (decoding is not
what these tests compare), and checkpoints at the end; --stop-at-step stops it at a step as a signal
would (the checkpoint then holds the unfinished epoch), --resume continues from the checkpoint.
gpt2: project/train_gpt2.py's main() with the options after `--`.  --simple runs either on SimpleOps
(pure Python: no numba compilation, fast for these sizes) instead of the --backend it names.
compare: whether the translation checkpoints in --out and --against hold the same training (the
same progress, parameters and AdamW moments within --tolerance, or --exact: bit for bit), with one
exception on different numbers of processes: the key part of the attention's qkv bias.  Its gradient
is zero in exact arithmetic (softmax does not change when every score of a row moves by the same
amount), so what it gets is rounding noise, which AdamW divides by its own magnitude into steps of
about lr whose sign depends on the order of the sums.

    torchrun --standalone --nproc_per_node 2 scripts/ddp_programs.py translation --out DIR --simple [--zero 1]
        [--micro-batch-size 2] [--stop-at-step K] [--resume] [--save-every-steps 1] [--batch-size 8]
    torchrun --standalone --nproc_per_node 2 scripts/ddp_programs.py gpt2 --simple -- --train-shards ... --out-dir DIR
    python scripts/ddp_programs.py compare --out DIR --against OTHER [--exact]

Without torchrun it is the same run in one process.  Used by tests/test_parallel_programs.py (gloo)
and kernel_tests/test_distributed_cuda.py (NCCL), through the functions at its end: start a run
(alone, under torchrun, as two "nodes" of one host, or as two processes of which one gets killed),
wait for it, compare two runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import minitorch
from project.common.checkpoint import CheckpointError, load_checkpoint
from project.common.options import lenient
from project.translation.batches import EncodedPairs
from project.translation import options as mt_options
from project.translation.parallel import TranslationParallel
from project.translation.run import TranslationRun, restore_run_state
from project.translation.tokenizer import EOS_DE_ID, EOS_EN_ID

VOCAB = 16
TINY = {"n_embd": 8, "n_head": 2, "n_layers": 1, "max_len": 10, "dropout": 0.0, "lr": 3e-3, "warmup_steps": 2,
        "weight_decay": 0.01, "grad_clip": 1.0, "seed": 3, "log_every": 1, "save_every_minutes": 0.0,
        "use_fused_kernel": True, "loss": "naive", "attention": "naive"}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("program", choices=("translation", "gpt2", "compare"))
    p.add_argument("--simple", action="store_true", help="train on SimpleOps, whatever the backend option says")
    p.add_argument("--backend", choices=("cpu", "cuda"), default="cpu", help="translation: the backend")
    p.add_argument("--out", help="translation: the run's directory")
    p.add_argument("--against", help="compare: the reference run's directory")
    p.add_argument("--exact", action="store_true", help="compare: bit for bit, the key bias included")
    p.add_argument("--tolerance", type=float, default=1e-5, help="compare: most |difference| / largest |value| of a tensor")
    p.add_argument("--n-embd", type=int, default=8, help="translation: model width")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8, help="translation: the global batch (pairs)")
    p.add_argument("--pairs", type=int, default=40, help="translation: generated training pairs")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--lost-rank-timeout", type=float, default=30.0)
    p.add_argument("--save-every-steps", type=int, default=0)
    p.add_argument("--stop-at-step", type=int, default=0, help="stop (saved) once this many steps are done")
    p.add_argument("--resume", action="store_true")
    return p


def sequences(n: int, seed: int = 0) -> List[np.ndarray]:
    """n sequences de <eos_de> en <eos_en> over a vocabulary of VOCAB tokens, 2 to 8 tokens long."""
    rng = np.random.default_rng(seed)
    words = np.arange(3, VOCAB)
    return [np.concatenate([rng.choice(words, rng.integers(1, 4)), [EOS_DE_ID], rng.choice(words, rng.integers(0, 4)),
                            [EOS_EN_ID]]).astype(np.int64) for _ in range(n)]  # fmt: skip


class _Vocabulary:
    """The one thing TranslationRun asks of the tokenizer."""

    @staticmethod
    def get_vocab_size() -> int:
        return VOCAB


class _StopAt:
    """A stop request once the run has done `step` steps (as GracefulStop after a signal)."""

    def __init__(self, job: TranslationRun, step: int):
        self.job, self.step = job, step

    @property
    def requested(self) -> Optional[str]:
        return "stop-at-step" if self.step and self.job.progress["step"] >= self.step else None


def backend_of(args: argparse.Namespace) -> minitorch.TensorBackend:
    if args.simple:
        return minitorch.TensorBackend(minitorch.SimpleOps)
    return minitorch.TensorBackend(minitorch.CudaKernelOps if args.backend == "cuda" else minitorch.FastOps)


def translation(args: argparse.Namespace) -> None:
    config: Dict[str, Any] = {**vars(lenient(mt_options.build_parser()).parse_args([])), **TINY}
    config.update(n_embd=args.n_embd, out_dir=args.out, backend=args.backend, epochs=args.epochs, batch_size=args.batch_size,
                  micro_batch_size=args.micro_batch_size, zero=args.zero, lost_rank_timeout=args.lost_rank_timeout,
                  save_every_steps=args.save_every_steps, cuda_graphs=args.backend == "cuda")  # fmt: skip
    out = Path(args.out)
    with TranslationParallel(args.backend, config, resume_hint=f"resume from {out / mt_options.CHECKPOINT_NAME}") as parallel:
        minitorch.manual_seed(config["seed"])
        np.random.seed(config["seed"])
        # No validation or test sentences: the run's plan counts them, the epochs here never evaluate.
        data = {"tokenizer": _Vocabulary(), "train": EncodedPairs(sequences(args.pairs), 0), "valid": EncodedPairs([], 0),
                "prompts": []}  # fmt: skip
        job = TranslationRun(config, backend_of(args), data, parallel)
        parallel.before_close(job.step.release_graphs)
        if args.resume:
            checkpoint = load_checkpoint(out / mt_options.CHECKPOINT_NAME, mt_options.CHECKPOINT_KIND)
            job.resumed(restore_run_state(checkpoint, job.model, job.optimizer, job.batcher))
        parallel.decorrelate_rng()
        train_epochs(job, parallel, config["epochs"], _StopAt(job, args.stop_at_step))


def train_epochs(job: TranslationRun, parallel: TranslationParallel, epochs: int, stop: _StopAt) -> None:
    """main()'s epochs without the evaluation: train, then checkpoint at each epoch's end."""
    for epoch in range(job.progress["epoch"] + 1, epochs + 1):
        if job.progress["partial"] is None:
            job.progress["partial"] = {"epoch": epoch, "trained": False, "lr": None, "loss_sum": 0.0,
                                       "n_targets": 0, "n_tokens": 0, "train_seconds": 0.0}  # fmt: skip
        if not job.train_epoch(epoch, stop):
            parallel.print(f"stopped at step {job.progress['step']}", flush=True)
            return
        job.progress = {"epoch": epoch, "step": job.progress["step"], "partial": None}
        job.save()
        parallel.print(f"epoch {epoch} done at step {job.progress['step']}", flush=True)


def gpt2(args: argparse.Namespace) -> None:
    from project.gpt2 import main as gpt2_main

    if args.simple:
        choice = minitorch.BackendChoice(backend_of(args), "cpu", "SimpleOps, for the data-parallel tests")
        gpt2_main.backend_from_option = lambda name: choice
    gpt2_main.main(args.rest)


def checkpoint_of(out: Path) -> Any:
    return load_checkpoint(Path(out) / mt_options.CHECKPOINT_NAME, mt_options.CHECKPOINT_KIND)


def differences(out: Path, against: Path, exact: bool = False, tolerance: float = 1e-5) -> List[str]:
    """What differs between the training in two translation checkpoints (see the module docstring)."""
    got, want = checkpoint_of(out), checkpoint_of(against)
    found = [] if got.state["progress"] == want.state["progress"] else [f"progress {got.state['progress']}"]
    key_bias = np.s_[want.config["n_embd"] : 2 * want.config["n_embd"]]
    pairs = [(name, got.state["model"][name], value) for name, value in want.state["model"].items()]
    pairs += [(f"{m}[{i}]", got.state["optimizer"][m][i], value) for m in ("m", "v")
              for i, value in want.state["optimizer"][m].items()]  # fmt: skip
    for name, mine, value in pairs:
        if name.endswith("qkv_projection.bias") and not exact:
            mine, value = np.delete(mine, key_bias), np.delete(value, key_bias)
        error = float(np.abs(mine - value).max() / max(np.abs(value).max(), 1e-30))
        if (exact and not np.array_equal(mine, value)) or error > tolerance:
            found.append(f"{name}: relative difference {error:.2e}")
    return found


def compare(args: argparse.Namespace) -> None:
    found = differences(Path(args.out), Path(args.against), args.exact, args.tolerance)
    print(f"{args.out} against {args.against}: " + ("the same training" if not found else "; ".join(found[:10])))
    sys.exit(1 if found else 0)


# ---- for the tests that drive this script ---------------------------------------------------------
SCRIPT = str(Path(__file__).resolve())
ROOT = str(Path(__file__).resolve().parent.parent)


def free_port() -> int:
    """A TCP port of this host that nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(**extra: str) -> Dict[str, str]:
    """The environment of a run: this one, the repository importable, one thread a process, and extra."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONPATH": ROOT, **extra}


def start(args: Sequence[str], processes: int = 1, **env: str) -> subprocess.Popen:
    """This script with these arguments, alone or under torchrun --standalone, its output piped."""
    command = [sys.executable, SCRIPT, *args]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                   SCRIPT, *args]  # fmt: skip
    return subprocess.Popen(command, env=environment(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_nodes(args: Sequence[str], port: int, devices: Sequence[str] = ("", "")) -> List[subprocess.Popen]:
    """One `torchrun --nnodes N --nproc_per_node 1 --rdzv-backend c10d` command per "node" of this
    host (N = len(devices); devices: each node's CUDA_VISIBLE_DEVICES, "" for the CPU)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(devices)), "--nproc_per_node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", SCRIPT, *args]  # fmt: skip
    return [subprocess.Popen(command, env=environment(**({"CUDA_VISIBLE_DEVICES": d} if d else {})),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for d in devices]  # fmt: skip


def kill_one(args: Sequence[str], port: int, out: Path, logs: Path, at_step: int = 2) -> Tuple[int, float, str]:
    """Start 2 processes of `args`, each its own command (as on two hosts: no launcher ends the other),
    SIGKILL rank 1 once out's checkpoint is at step at_step, and wait for rank 0: (its exit status,
    seconds it took after the kill, its output)."""
    workers = []
    for rank in range(2):
        env = environment(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))  # fmt: skip
        with open(logs / f"rank{rank}.log", "w") as log:
            workers.append(subprocess.Popen([sys.executable, SCRIPT, *args], env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 300
    while saved_step(out) < at_step:
        if time.monotonic() > deadline or workers[0].poll() is not None:
            raise AssertionError(f"no checkpoint of step {at_step}:\n{(logs / 'rank0.log').read_text()[-3000:]}")
        time.sleep(0.05)
    workers[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    status = workers[0].wait(timeout=120)
    return status, time.monotonic() - killed, (logs / "rank0.log").read_text()


def saved_step(out: Path) -> int:
    """The step of out's translation checkpoint (-1 while there is none)."""
    try:
        return checkpoint_of(out).state["progress"]["step"]
    except CheckpointError:
        return -1


def finish(*runs: subprocess.Popen, timeout: float = 600) -> str:
    """Wait for runs started together; AssertionError with its output where one failed; the output
    of the last."""
    logs = [run.communicate(timeout=timeout)[0] for run in runs]
    for run, log in zip(runs, logs):
        assert run.returncode == 0, log[-4000:]
    return logs[-1]


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    args.rest = argv[cut + 1 :]  # gpt2: the program's own options
    {"translation": translation, "gpt2": gpt2, "compare": compare}[args.program](args)


if __name__ == "__main__":
    main()
