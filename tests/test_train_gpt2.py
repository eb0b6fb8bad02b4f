"""The GPT-2 training program (project/train_gpt2.py) end to end on a tiny model on the CPU: outputs,
exact resume from a checkpoint, the learning-rate schedule and refused options."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from project.common.schedule import learning_rate
from project.gpt2.data import prepare_shards
from project.gpt2.llmc import GPT2Config, read_checkpoint
import project.gpt2.main as gpt2_main
from project.gpt2.main import main
from project.gpt2.options import build_parser
from project.gpt2.model import GPT2

ROOT = Path(__file__).resolve().parent.parent
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
        "--backend", "cpu", "--preset", "full", "--train-shards", shards.train_pattern, "--val-shards", shards.val_pattern,
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
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    two = tmp_path / "two"
    args = tiny_args(shards, two, *FRESH, "--vocab-size", str(shards.vocab_size))
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "project" / "train_gpt2.py"), *args]  # fmt: skip
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
    with pytest.raises(SystemExit, match="error: --train-shards '.*none_.*' matches no file"):
        main(["--backend", "cpu", "--train-shards", str(tmp_path / "none_*.bin")])
    with pytest.raises(SystemExit):
        main(tiny_args(shards, tmp_path / "c", "--final-lr-frac", "2"))
    with pytest.raises(SystemExit, match="error: --resume-from .* holds no checkpoint"):
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
    with pytest.raises(SystemExit, match=r"error: .*train_000000\.bin: token id \d+ at position \d+ is outside \[0, 5\)"):
        main(tiny_args(shards, tmp_path / "d", "--init-from", str(model_bin)))


def test_sigint_saves_and_the_printed_command_resumes_bit_exactly(shards, tmp_path, capsys, monkeypatch):
    """SIGINT during step 3 of 6: the step finishes, a checkpoint is saved, main() returns (the script
    exits 0) with the command that continues; that command ends with the uninterrupted run's model."""
    fresh = [*FRESH, "--vocab-size", str(shards.vocab_size), "--steps", "6", "--checkpoint-every", "0"]
    straight = tmp_path / "straight"
    main(tiny_args(shards, straight, *fresh))
    capsys.readouterr()

    class InterruptedStep(gpt2_main.GPT2Step):
        calls = 0

        def queue(self, *args, **kwargs):
            InterruptedStep.calls += 1
            if InterruptedStep.calls == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return super().queue(*args, **kwargs)

    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(gpt2_main, "GPT2Step", InterruptedStep)
        stopped = main(tiny_args(shards, run, *fresh))
    assert stopped["stopped"] == "SIGINT"
    last = capsys.readouterr().out.splitlines()[-1]
    saved = run / "checkpoint_000003"
    assert last.startswith(f"stopped by SIGINT at step 3/6; saved {saved}; continue with: python ")
    assert sorted(p.name for p in saved.iterdir()) == ["model.bin", "state.npz"] and not (run / "model.bin").exists()
    command = shlex.split(last.split("continue with: ")[1])
    assert command[-2:] == ["--resume-from", str(saved)] and "--depth" not in command
    main(command[2:])
    assert (run / "model.bin").read_bytes() == (straight / "model.bin").read_bytes()
    losses = [[r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
              for d in (run, straight)]  # fmt: skip
    assert losses[0] == losses[1]


SMALL = ["--depth", "1", "--channels", "16", "--heads", "4", "--max-seq-len", "16"]
BAD_GPT2_INPUTS = {
    "empty glob": ([*SMALL, "--train-shards", "{tmp}/none_*.bin"], r"--train-shards '.*none_\*\.bin' matches no file"),
    "channels not divisible by heads": (["--channels", "100", "--heads", "12"], "--channels 100 is not a multiple of --heads 12"),
    "missing --init-from": (["--init-from", "{tmp}/gpt2_124M.bin"], r"--init-from .*gpt2_124M\.bin does not exist"),
    "truncated shard": ([*SMALL, "--train-shards", "{tmp}/truncated_*.bin"], r"truncated_0\.bin: truncated llm\.c token shard"),
    "wrong magic": ([*SMALL, "--train-shards", "{tmp}/magic_*.bin"],
                    r"magic_0\.bin: header\[0\] \(magic\) is 7, expected 20240520"),
    "token id beyond the vocabulary": ([*SMALL, "--vocab-size", "100"], r"token id \d+ at position \d+ is outside \[0, 100\)"),
    "a value out of its bound": ([*SMALL, "--final-lr-frac", "2"], r"argument --final-lr-frac: 2\.0 is outside \[0, 1\]"),
    "an unknown option": ([*SMALL, "--learning-rate", "1"], r"unrecognized arguments: --learning-rate 1"),
    "--seq-len beyond the model": ([*SMALL, "--max-seq-len", "8"], "--seq-len 16 exceeds the model's max_seq_len 8"),
    "samples from a token beyond the vocabulary": ([*SMALL, "--vocab-size", "300", "--train-shards", "{tmp}/plain_*.bin"],
                                                   r"--eot-id 50256, where samples start without a tokenizer, is outside "
                                                   r"the model's vocabulary of 300"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_GPT2_INPUTS))
def test_every_bad_input_is_one_error_line_and_exit_1(shards, tmp_path, case):
    options, expected = BAD_GPT2_INPUTS[case]
    data = shards.train_shards[0][0].read_bytes()
    (tmp_path / "truncated_0.bin").write_bytes(data[:-10])
    (tmp_path / "magic_0.bin").write_bytes(np.int32(7).tobytes() + data[4:])
    (tmp_path / "plain_0.bin").write_bytes(data)  # no tokenizer beside it
    argv = tiny_args(shards, tmp_path / "out", *(word.replace("{tmp}", str(tmp_path)) for word in options))
    done = subprocess.run([sys.executable, str(ROOT / "project" / "train_gpt2.py"), *argv], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    errors = done.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and re.search(expected, errors[0]), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
