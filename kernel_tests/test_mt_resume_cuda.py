"""The translation program on the CUDA backend: a few training steps touching every kernel library
(a small case for scripts/sanitize.sh), and kill -9 and SIGINT followed by --resume, after which
parameters, optimizer moments and metrics match an uninterrupted run.

Bit-for-bit equality is not asserted: a kernel that sums with atomics (so in an order that varies
between runs) breaks it, so parameters and moments are compared to a relative 1e-3 (max |difference|
/ max |value| per tensor) and losses to 1e-4; on an H100, with the embedding backward still using
atomics, the largest difference was 2.3e-7. The attention key bias is left out: its exact gradient is
0 (a constant added to every score of a query), so its gradient, moments and AdamW updates are
rounding noise, which any difference upstream changes completely: the middle third of the packed
q/k/v projection's bias is left out of its comparison. The CPU version (bit for bit) is
tests/test_mt_interrupt.py.

The SIGINT always lands in training: the run has 30 steps (2 epochs of 15) and saves after each; once
the resumed run has saved its first step, it is frozen (SIGSTOP) while the test checks that steps are
left, and the SIGINT is pending when it continues (SIGCONT), so it stops after the step it is in."""

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from mt_program import TINY, load, saved_step, start, wait_for_step, write_corpus  # noqa: E402
from project import run_machine_translation as run_mt  # noqa: E402

CUDA_TINY = [a if a != "cpu" else "cuda" for a in TINY]
PARAM_TOL = 1e-3
LOSS_TOL = 1e-4
QKV_BIAS = ".attention.qkv_projection.bias"


def relative(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), 1e-30)


def without_key_bias(name: str, value: np.ndarray) -> np.ndarray:
    """value, less the key bias's third where name is a packed q/k/v bias (or one of its moments)."""
    if QKV_BIAS not in name:
        return value
    third = value.shape[-1] // 3
    return np.concatenate([value[:third], value[2 * third :]])


@pytest.mark.parametrize("attention, loss", [("naive", "naive"), ("fused", "fused")])
def test_a_few_training_steps_use_every_library(tmp_path, attention: str, loss: str) -> None:
    """Two eager steps (no CUDA graphs), validation and decoding: embedding, matmul, fused softmax or
    attention, LayerNorm, dropout (random), naive or fused loss (classifier), multi-tensor AdamW."""
    write_corpus(tmp_path)
    result = run_mt.main(CUDA_TINY + ["--epochs", "1", "--samples-per-epoch", "32", "--valid-samples", "8",
                                      "--test-samples", "4", "--attention", attention, "--loss", loss,
                                      "--cuda-graphs", "false", "--data-dir", str(tmp_path),
                                      "--out-dir", str(tmp_path / "out")])  # fmt: skip
    record = result["history"][0]
    assert record["step"] == 2 and 0.0 < record["train_loss"] < np.log(300) + 1.0, record
    assert np.isfinite(record["valid_loss"]) and 0.0 <= record["bleu"] <= 100.0, record


def test_kill_9_then_sigint_then_resume_matches_the_uninterrupted_run(tmp_path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus)
    common = CUDA_TINY + ["--epochs", "2", "--samples-per-epoch", "240", "--data-dir", str(corpus)]
    straight = run_mt.main(common + ["--out-dir", str(tmp_path / "straight")])
    total = 2 * 15

    out = tmp_path / "run"
    rng = np.random.default_rng()
    kill_at = int(rng.integers(2, 7))
    log = tmp_path / "first.log"
    first = start(common + ["--out-dir", str(out), "--save-every-steps", "1"], log)
    wait_for_step(first, out, kill_at, log)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = saved_step(out)
    log = tmp_path / "second.log"
    second = start(["--resume", "--out-dir", str(out), "--save-every-steps", "1"], log)
    wait_for_step(second, out, killed_at + 1, log)
    os.kill(second.pid, signal.SIGSTOP)
    frozen_at = saved_step(out)
    assert frozen_at < total - 1, f"the resumed run was frozen at step {frozen_at} of {total}: no step left to stop in"
    second.send_signal(signal.SIGINT)
    os.kill(second.pid, signal.SIGCONT)
    assert second.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert log.read_text().splitlines()[0].startswith("backend cuda")
    assert "stopped by SIGINT" in log.read_text().splitlines()[-1]
    stopped_at = saved_step(out)
    resumed = run_mt.main(["--resume", "--out-dir", str(out)])

    expected, got = load(tmp_path / "straight"), load(out)
    assert got["progress"] == expected["progress"] == {"epoch": 2, "step": total, "partial": None}
    differences = {}
    for i, (name, value) in enumerate(expected["model"].items()):  # optimizer index i is parameter i
        differences[name] = relative(without_key_bias(name, got["model"][name]), without_key_bias(name, value))
        for moment in ("m", "v"):
            reference = without_key_bias(name, expected["optimizer"][moment][str(i)])
            differences[f"{name} {moment}"] = relative(without_key_bias(name, got["optimizer"][moment][str(i)]), reference)
    print(f"\nkilled after step {killed_at}, SIGINT after step {stopped_at}; relative differences:")
    for name, difference in differences.items():
        print(f"  {name:50s} {difference:.2e}")
    name = max(differences, key=differences.get)
    assert differences[name] < PARAM_TOL, f"{name}: relative difference {differences[name]:.3g}"
    for a, b in zip(resumed["history"], straight["history"]):
        assert (a["epoch"], a["step"], a["lr"], a["tokens"]) == (b["epoch"], b["step"], b["lr"], b["tokens"])
        for key in ("train_loss", "valid_loss"):
            assert a[key] == pytest.approx(b[key], rel=LOSS_TOL), (key, a[key], b[key])
        print(f"epoch {a['epoch']}: train loss {a['train_loss']:.6f} vs {b['train_loss']:.6f}, valid loss "
              f"{a['valid_loss']:.6f} vs {b['valid_loss']:.6f}, BLEU {a['bleu']:.2f} vs {b['bleu']:.2f}")  # fmt: skip
