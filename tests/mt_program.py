"""Shared pieces of the translation program's tests: the tiny configuration, a small corpus and
checkpoint access. The session fixtures `corpus_dir` and `straight_run` (tests/conftest.py) use them.

The corpus is the first lines of the real Multi30k files cut to their first four words (so a
pair stays a rough translation and fits max_len 40 with a 300-token vocabulary), or generated
word-by-word "translations" where the real corpus is absent.
"""

import gzip
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from project.common.checkpoint import CheckpointError, load_checkpoint
from project.translation import corpus as mt_corpus
from project.translation import main as run_mt
from project.translation import run as mt_run
from project.translation.options import CHECKPOINT_KIND

REAL_DATA_DIR = Path(__file__).resolve().parent.parent / ".." / "shared" / "data" / "multi30k"
SPLIT_SIZES = {"train": 240, "valid": 32, "test": 12}
TINY = [
    "--backend", "cpu", "--preset", "full", "--use-fused-kernel", "true", "--seed", "3",
    "--n-embd", "32", "--n-head", "2", "--n-layers", "1", "--vocab-size", "300", "--max-len", "40",
    "--batch-size", "16", "--samples-per-epoch", "128", "--lr", "3e-3", "--warmup-steps", "3",
    "--eval-batch-size", "64",
]
# Fields of a metrics record that depend on the clock or the process (a resumed run captures its
# CUDA graphs again), not on the computation.
TIMING_FIELDS = {"tokens_per_s", "tokens_per_s_median_step", "train_seconds", "eval_seconds", "seconds", "peak_memory_mb",
                 "graphs_captured"}


def generated_pairs(n: int, seed: int) -> List[Tuple[str, str]]:
    words = [("Hund", "dog"), ("Mann", "man"), ("Frau", "woman"), ("Kind", "child"), ("rennt", "runs"),
             ("sitzt", "sits"), ("rot", "red"), ("groß", "big"), ("Ball", "ball"), ("Wasser", "water")]
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        chosen = [words[i] for i in rng.integers(0, len(words), rng.integers(2, 5))]
        pairs.append((" ".join(de for de, _ in chosen), " ".join(en for _, en in chosen)))
    return pairs


def write_corpus(directory: Path) -> None:
    real = not mt_corpus.missing_files(REAL_DATA_DIR)
    for i, (split, n) in enumerate(SPLIT_SIZES.items()):
        if real:
            pairs = [tuple(" ".join(s.split()[:4]) for s in pair) for pair in mt_corpus.read_split(REAL_DATA_DIR, split)[:n]]
        else:
            pairs = generated_pairs(n, seed=i)
        for side, lang in enumerate(mt_corpus.LANGUAGES):
            with gzip.open(directory / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(pair[side] + "\n" for pair in pairs)


def load(out_dir: Path) -> Dict:
    """The checkpoint's state, with its configuration as "args"."""
    checkpoint = load_checkpoint(out_dir / "checkpoint.npz", CHECKPOINT_KIND)
    return {**checkpoint.state, "args": checkpoint.config}


class Preempted(Exception):
    """What stops a run right after a checkpoint in run_until_first_save."""


def run_until_first_save(argv: List[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The program on argv, stopped right after it writes its first checkpoint (as a preempted job)."""
    save = mt_run.save_checkpoint

    def save_then_stop(*args: Any) -> None:
        save(*args)
        raise Preempted

    monkeypatch.setattr(mt_run, "save_checkpoint", save_then_stop)
    with pytest.raises(Preempted):
        run_mt.main(argv)
    monkeypatch.undo()


def assert_same_training_state(state: Dict, other: Dict) -> None:
    """Two checkpoints' states (load's) hold equal parameters and AdamW moments."""
    for name, value in state["model"].items():
        np.testing.assert_array_equal(other["model"][name], value, err_msg=name)
    for moment in ("m", "v"):
        for i, value in state["optimizer"][moment].items():
            np.testing.assert_array_equal(other["optimizer"][moment][i], value)


def computed(history: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Metric records without the fields that depend on the clock."""
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in history]


# ---- the program as a subprocess (to kill it) -------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "project" / "run_machine_translation.py"
WAIT_S = 900  # a subprocess compiles its numba kernels first: minutes on a busy 2-core machine


def start(args: list, log: Path) -> subprocess.Popen:
    """The program with these arguments, its output going to log."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT)  # fmt: skip


def saved_step(out_dir: Path) -> int:
    """The step of the checkpoint in out_dir (-1 while there is none)."""
    try:
        return load_checkpoint(out_dir / "checkpoint.npz", CHECKPOINT_KIND).state["progress"]["step"]
    except CheckpointError:
        return -1


def wait_for_step(proc: subprocess.Popen, out_dir: Path, step: int, log: Path) -> int:
    """Wait until the checkpoint in out_dir is at `step` or later (fail if the process ends first)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        reached = saved_step(out_dir)
        if reached >= step:
            return reached
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before step {step}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no checkpoint of step {step} within {WAIT_S}s:\n{log.read_text()[-3000:]}")
