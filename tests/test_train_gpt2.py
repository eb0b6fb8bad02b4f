"""The GPT-2 training program (project/train_gpt2.py) end to end on a tiny model on the CPU: outputs,
exact resume from a checkpoint, the learning-rate schedule and refused options."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from project.common.schedule import learning_rate
from project.gpt2.data import prepare_shards
from project.gpt2.llmc import GPT2Config, read_checkpoint
from project.gpt2.main import build_parser, main
from project.gpt2.model import GPT2

WORDS = "a man with a red hat walks his dog along the beach while two children play in the sand".split()


def word_shards(root: Path):
    """Shards (BPE 300) of 400 lines of random words from WORDS, in root."""
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(5, 12))) for _ in range(400)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return prepare_shards(root / "corpus.txt", root / "data", vocab_size=300, val_fraction=0.1, progress=False)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return word_shards(tmp_path_factory.mktemp("gpt2_program"))


def tiny_args(shards, out_dir, *extra):
    return [
        "--backend", "cpu", "--train-shards", shards.train_pattern, "--val-shards", shards.val_pattern,
        "--batch-size", "2", "--seq-len", "16", "--steps", "4", "--lr", "1e-3", "--val-every", "2",
        "--val-batches", "1", "--sample-every", "4", "--sample-tokens", "3", "--checkpoint-every", "2", "--grad-clip", "1",
        "--out-dir", str(out_dir), "--seed", "1", *extra,
    ]  # fmt: skip


FRESH = ["--depth", "2", "--channels", "64", "--heads", "4", "--max-seq-len", "16"]


def test_program_writes_model_metrics_plot_and_resumes_exactly(shards, tmp_path, capsys):
    run = tmp_path / "run"
    result = main(tiny_args(shards, run, *FRESH, "--vocab-size", str(shards.vocab_size)))
    out = capsys.readouterr().out
    assert "step     4/4 | loss" in out and "tok/s | grad norm" in out and "sample: '" in out
    config, params = read_checkpoint(run / "model.bin")
    assert (config.num_layers, config.channels, config.vocab_size) == (2, 64, shards.vocab_size)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in records if "val_loss" in r] == [0, 2, 4]
    assert all(r["ms"] > 0 and r["tokens_per_s"] > 0 for r in records if "loss" in r)
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["records"] == records
    for name, value in result["model"].llmc_params().items():
        np.testing.assert_array_equal(value, params[name], err_msg=name)

    resumed = tmp_path / "resumed"
    main(tiny_args(shards, resumed, "--resume-from", str(run / "checkpoint_000002")))
    assert (resumed / "model.bin").read_bytes() == (run / "model.bin").read_bytes()
    again = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in again if "loss" in r] == [r["loss"] for r in records if r.get("step", 0) > 2 and "loss" in r]

    init = tmp_path / "init"
    main(tiny_args(shards, init, "--init-from", str(run / "model.bin"), "--steps", "1", "--activation", "relu",
                   "--attention", "naive", "--loss", "naive", "--use-fused-kernel", "false"))
    assert read_checkpoint(init / "model.bin")[0] == config


def test_two_processes_under_torchrun_equal_one_process_on_the_same_global_batch(shards, tmp_path):
    """torchrun --nproc_per_node 2 with the same global --batch-size 2 (gloo: a row each, weighted
    losses, summed gradients) trains the model that one process trains (the two slices tile its
    batch); the 2-process checkpoint resumes in one process."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    two = tmp_path / "two"
    args = tiny_args(shards, two, *FRESH, "--vocab-size", str(shards.vocab_size))
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(root / "project" / "train_gpt2.py"), *args]  # fmt: skip
    workers = subprocess.run(run, env=env, capture_output=True, text=True, timeout=600)
    assert workers.returncode == 0, workers.stdout + workers.stderr
    assert workers.stdout.count("step     4/4 | loss") == 1  # rank 0 prints
    one = tmp_path / "one"
    main(tiny_args(shards, one, *FRESH, "--vocab-size", str(shards.vocab_size)))
    losses = [[r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
              for d in (two, one)]  # fmt: skip
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    params = [read_checkpoint(d / "model.bin")[1] for d in (two, one)]
    for name, value in params[1].items():
        np.testing.assert_allclose(params[0][name], value, rtol=1e-4, atol=2e-5, err_msg=name)  # Adam: m / sqrt(v) magnifies rounding
    resumed = tmp_path / "resumed"
    main(tiny_args(shards, resumed, "--resume-from", str(two / "checkpoint_000002")))
    for name, value in read_checkpoint(resumed / "model.bin")[1].items():
        np.testing.assert_allclose(value, params[1][name], rtol=1e-4, atol=2e-5, err_msg=name)  # Adam: m / sqrt(v) magnifies rounding


def test_program_refuses_conflicting_or_impossible_options(shards, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(tiny_args(shards, tmp_path / "a", "--init-from", "x.bin", "--depth", "2"))
    assert "--depth describe a fresh model" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--seq-len 16 exceeds the model's max_seq_len 8"):
        main(tiny_args(shards, tmp_path / "b", *FRESH[:6], "--max-seq-len", "8", "--vocab-size", "300"))
    with pytest.raises(FileNotFoundError, match="no token shards match"):
        main(["--backend", "cpu", "--train-shards", str(tmp_path / "none_*.bin")])
    with pytest.raises(SystemExit):
        main(tiny_args(shards, tmp_path / "c", "--final-lr-frac", "2"))
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        main(tiny_args(shards, tmp_path / "e", "--resume-from", str(tmp_path)))


def test_help_shows_defaults_and_schedule_is_llmc():
    text = build_parser().format_help()
    assert "(default: 0.0003)" in text and "--activation {softmax,relu}" in text
    assert [learning_rate(s, 1.0, 2, 10, 0.1) for s in (0, 1)] == [0.5, 1.0]
    assert learning_rate(2, 1.0, 2, 10, 0.1) == 1.0 and abs(learning_rate(10, 1.0, 2, 10, 0.1) - 0.1) < 1e-12
    assert learning_rate(6, 1.0, 2, 10, 0.1) == pytest.approx(0.55)
    assert learning_rate(7, 3e-4, 0, 20, 1.0) == 3e-4


def test_vocab_of_data_beyond_model_is_refused(shards, tmp_path):
    model_bin = tmp_path / "small.bin"
    GPT2.fresh(GPT2Config(16, 5, 8, 1, 1, 8)).save_checkpoint(model_bin)
    with pytest.raises(ValueError, match=r"outside \[0, 5\)"):
        main(tiny_args(shards, tmp_path / "d", "--init-from", str(model_bin)))
