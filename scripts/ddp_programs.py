"""Both training programs' data-parallel code on tiny models, for the tests that compare world sizes.

translation: the translation program's run (project/translation/run.py: TranslationRun, its
parallel steps, micro-batches, ZeRO-1, checkpoints, the watchdog) trains a tiny DecoderLM on
generated sequences, epoch after epoch as main() does but without the evaluation (decoding is not
what these tests compare), and checkpoints at the end; --stop-at-step stops it at a step as a signal
would (the checkpoint then holds the unfinished epoch), --resume continues from the checkpoint.
gpt2: project/train_gpt2.py's main() with the options after `--`.  --simple runs either on SimpleOps
(pure Python: no numba compilation, fast for these sizes) instead of the --backend it names.

    torchrun --standalone --nproc_per_node 2 scripts/ddp_programs.py translation --out DIR --simple [--zero 1]
        [--micro-batch-size 2] [--stop-at-step K] [--resume] [--save-every-steps 1] [--batch-size 8]
    torchrun --standalone --nproc_per_node 2 scripts/ddp_programs.py gpt2 --simple -- --train-shards ... --out-dir DIR

Without torchrun it is the same run in one process.  Used by tests/test_parallel_programs.py (gloo)
and kernel_tests/test_distributed_cuda.py (NCCL).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import minitorch
from project.common.checkpoint import load_checkpoint
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
    p.add_argument("program", choices=("translation", "gpt2"))
    p.add_argument("--simple", action="store_true", help="train on SimpleOps, whatever the backend option says")
    p.add_argument("--backend", choices=("cpu", "cuda"), default="cpu", help="translation: the backend")
    p.add_argument("--out", help="translation: the run's directory")
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
    config.update(out_dir=args.out, backend=args.backend, epochs=args.epochs, batch_size=args.batch_size,
                  micro_batch_size=args.micro_batch_size, zero=args.zero, lost_rank_timeout=args.lost_rank_timeout,
                  save_every_steps=args.save_every_steps, cuda_graphs=args.backend == "cuda")  # fmt: skip
    out = Path(args.out)
    with TranslationParallel(args.backend, config, resume_hint=f"resume from {out / mt_options.CHECKPOINT_NAME}") as parallel:
        minitorch.manual_seed(config["seed"])
        np.random.seed(config["seed"])
        data = {"tokenizer": _Vocabulary(), "train": EncodedPairs(sequences(args.pairs), 0)}
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


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    args.rest = argv[cut + 1 :]  # gpt2: the program's own options
    (translation if args.program == "translation" else gpt2)(args)


if __name__ == "__main__":
    main()
