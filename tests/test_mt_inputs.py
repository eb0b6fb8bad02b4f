"""The translation program checks its input before training: each bad input gives one line naming the
file or option and what to do, and leaves an earlier run's files as they were; --help shows every
default; --backend auto says what it chose; --preset tiny sets defaults that explicit options override."""

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mt_program import ROOT, SCRIPT, TINY
import minitorch
from project.common.options import backend_from_option
from project.translation import corpus as mt_corpus
from project.translation import main as run_mt
from project.translation import options as mt_options


def files(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def error_of(argv: list) -> str:
    with pytest.raises(SystemExit) as info:
        run_mt.main(argv)
    message = str(info.value)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.fixture
def saved_run(straight_run, tmp_path) -> Path:
    """A copy of the two-epoch run's output directory (checkpoints, metrics, tokenizer)."""
    out = tmp_path / "saved"
    shutil.copytree(straight_run["out_dir"], out)
    return out


@pytest.fixture
def corpus(corpus_dir, tmp_path) -> Path:
    """A copy of the small corpus to damage."""
    directory = tmp_path / "corpus"
    shutil.copytree(corpus_dir, directory)
    return directory


def write_lines(path: Path, lines: list) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def test_missing_corpus_names_the_files_and_the_fix_without_any_download(tmp_path, monkeypatch, capsys) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("the program tried the network without --download")

    monkeypatch.setattr(mt_corpus.urllib.request, "urlopen", no_network)
    monkeypatch.setenv(mt_corpus.CACHE_DIR_ENV, str(tmp_path / "cache"))
    absent = tmp_path / "nowhere"
    message = error_of(TINY + ["--backend", "auto", "--data-dir", str(absent), "--out-dir", str(tmp_path / "out")])
    assert f"{absent} does not exist" in message and "train.de, train.en, valid.de" in message
    assert "not attempted" in message and "--download" in message and "--data-dir" in message
    first_line = capsys.readouterr().out.splitlines()[0]
    if minitorch.cuda_unavailable_reason() is None:
        assert first_line.startswith("backend cuda (auto")
    else:
        assert first_line.startswith(f"backend cpu (auto: CUDA unavailable: {minitorch.cuda_unavailable_reason()})")


def test_resume_with_bad_input_leaves_the_saved_run_untouched(saved_run, corpus, tmp_path) -> None:
    before = files(saved_run)
    (corpus / "valid.de.gz").unlink()
    message = error_of(["--resume", "--out-dir", str(saved_run), "--data-dir", str(corpus)])
    assert f"{corpus} lacks valid.de" in message
    message = error_of(["--resume", "--out-dir", str(saved_run), "--preset", "tiny"])
    assert "--preset chooses a new run's configuration" in message
    message = error_of(["--resume", "--out-dir", str(saved_run), "--test-samples", "13"])
    assert "--test-samples 13 exceeds the 12 test pairs in" in message
    message = error_of(["--resume", "--out-dir", str(saved_run), "--save-every-minutes", "-1"])
    assert "--save-every-minutes -1.0 must be >= 0" in message
    assert files(saved_run) == before


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("empty test split", r"test\.de\.gz is empty: the test split needs one sentence per line"),
        ("empty English side", r"train\.en\.gz is empty: the train split"),
        ("misaligned", r"valid\.de\.gz has 31 lines but .*valid\.en\.gz has 32; the two sides"),
        ("not gzip", r"test\.en\.gz is not readable UTF-8 text \(BadGzipFile"),
    ],
)
def test_bad_corpus_files_are_named(corpus, tmp_path, damage: str, expected: str) -> None:
    if damage == "empty test split":
        write_lines(corpus / "test.de.gz", [])
        write_lines(corpus / "test.en.gz", [])
    elif damage == "empty English side":
        write_lines(corpus / "train.en.gz", [])
    elif damage == "misaligned":
        write_lines(corpus / "valid.de.gz", mt_corpus.read_lines(corpus / "valid.de.gz")[:-1])
    else:
        (corpus / "test.en.gz").write_bytes(b"plain text, not gzip\n")
    out = tmp_path / "out"
    message = error_of(TINY + ["--data-dir", str(corpus), "--out-dir", str(out)])
    assert re.search(expected, message), message
    assert not (out / "checkpoint.npz").exists()


@pytest.mark.parametrize(
    "options, expected",
    [
        (["--valid-samples", "33"], "--valid-samples 33 exceeds the 32 valid pairs in"),
        (["--samples-per-epoch", "241"], "--samples-per-epoch 241 exceeds the 240 train pairs in"),
        (["--max-len", "4"], "all 240 training pairs are longer than --max-len 4 tokens; raise --max-len"),
        (["--n-embd", "30", "--n-head", "4", "--dropout", "1.5", "--lr", "0"],
         "--n-embd 30 is not a multiple of --n-head 4; --dropout 1.5 is outside [0, 1); --lr 0.0 must be positive"),
        (["--vocab-size", "100"], "--vocab-size 100 is below 259"),
    ],
)  # fmt: skip
def test_options_that_cannot_work_are_refused_before_training(corpus_dir, tmp_path, options, expected) -> None:
    out = tmp_path / "out"
    assert expected in error_of(TINY + options + ["--data-dir", str(corpus_dir), "--out-dir", str(out)])
    assert not (out / "checkpoint.npz").exists() and not (out / "metrics.jsonl").exists()


def test_output_directory_guards(saved_run, tmp_path) -> None:
    before = files(saved_run)
    assert "checkpoint.npz exists; pass --resume" in error_of(TINY + ["--out-dir", str(saved_run)])
    assert f"--resume: no checkpoint {tmp_path / 'checkpoint.npz'}" in error_of(["--resume", "--out-dir", str(tmp_path)])
    (tmp_path / "checkpoint.pkl").write_bytes(b"\x80\x04K\x01.")
    assert "checkpoint.pkl is a pickle checkpoint of an older version" in error_of(["--resume", "--out-dir", str(tmp_path)])
    assert files(saved_run) == before


def test_backend_cuda_without_cuda_says_what_to_use() -> None:
    reason = minitorch.cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA can run here")
    with pytest.raises(ValueError, match=r"the cuda backend cannot run here: .*--backend cpu / --backend auto"):
        backend_from_option("cuda")
    choice = backend_from_option("auto")
    assert not choice.backend.ops.is_cuda and str(choice) == f"backend cpu (auto: CUDA unavailable: {reason})"


def test_help_shows_every_default() -> None:
    parser = mt_options.build_parser()
    formatter = parser._get_formatter()
    shown = [a for a in parser._actions if a.dest != "help" and a.help != argparse.SUPPRESS]
    assert len(shown) > 25
    for action in shown:
        assert action.help, f"{action.option_strings} has no help text, so --help shows no default"
        assert f"(default: {action.default})" in formatter._expand_help(action), action.option_strings
    assert "(default: auto)" in " ".join(parser.format_help().split())


def test_preset_sets_defaults_that_explicit_options_override() -> None:
    args, explicit = mt_options.parse(["--preset", "tiny", "--n-layers", "3"])
    for key, value in mt_options.PRESETS["tiny"].items():
        assert args[key] == (3 if key == "n_layers" else value), key
    assert explicit == {"preset": "tiny", "n_layers": 3}
    assert mt_options.parse(["--preset", "full"])[0]["n_embd"] == 256


def test_preset_auto_is_full_on_cuda_and_tiny_on_a_cpu() -> None:
    assert mt_options.parse(["--backend", "cuda"])[0]["preset"] == "full"
    args = mt_options.parse(["--backend", "cpu"])[0]
    assert args["preset"] == "tiny" and args["n_embd"] == mt_options.PRESETS["tiny"]["n_embd"]
    auto = "full" if minitorch.cuda_unavailable_reason() is None else "tiny"
    assert mt_options.parse([])[0]["preset"] == auto


BAD_INPUTS = {
    "missing corpus": (["--data-dir", "{tmp}/nowhere"], r"nowhere does not exist.*--download"),
    "options that do not fit": (["--n-embd", "30", "--n-head", "4", "--dropout", "1.5"],
                                r"--n-embd 30 is not a multiple of --n-head 4; --dropout 1\.5 is outside \[0, 1\)"),
    "a choice that does not exist": (["--backend", "tpu"], r"argument --backend: invalid choice: 'tpu'"),
    "an unknown option": (["--learning-rate", "1"], r"unrecognized arguments: --learning-rate 1"),
    "--resume without a checkpoint": (["--resume"], r"--resume: no checkpoint .*checkpoint\.npz; train without --resume"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_every_bad_input_is_one_error_line_and_exit_1(corpus_dir, tmp_path, case: str) -> None:
    """The script itself: one line on stderr, status 1, no traceback (argparse's errors included)."""
    options, expected = BAD_INPUTS[case]
    argv = TINY + ["--data-dir", str(corpus_dir), "--out-dir", str(tmp_path / "out")]
    argv += [word.replace("{tmp}", str(tmp_path)) for word in options]
    if case == "--resume without a checkpoint":
        argv = ["--resume", "--out-dir", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    errors = done.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ") and re.search(expected, errors[0]), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
