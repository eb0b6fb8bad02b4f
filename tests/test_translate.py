"""project/translation/translate.py on a tiny model from a CI-sized run of the training program (trained with
label smoothing and --average-last), and the run's final evaluation, snapshots and averaging."""

import io
import re
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
from mt_program import SPLIT_SIZES, TINY, write_corpus

import minitorch
from project.translation import corpus as mt_corpus
from project.translation import main as run_mt
from project.translation import options as mt_options
from project.translation import translate
from project.translation.average import average_snapshots, snapshot_epochs

RUN = TINY + ["--epochs", "2", "--label-smoothing", "0.1", "--average-last", "2", "--final-beam-size", "3"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Dict:
    corpus = tmp_path_factory.mktemp("corpus")
    write_corpus(corpus)
    out = tmp_path_factory.mktemp("run")
    result = run_mt.main(RUN + ["--data-dir", str(corpus), "--out-dir", str(out)])
    result["corpus"] = corpus
    return result


def final_hypotheses(out: Path, name: str) -> List[str]:
    """The hyp of every block of a translations file (a tiny model's byte-level output may hold
    line breaks, so blocks are split at the next block's header)."""
    text = (out / f"translations_final_{name}.txt").read_text(encoding="utf-8")
    blocks = re.split(r"\n\n(?=\[\d+\]\nsrc: )", text)
    return [block.split("\nhyp: ", 1)[1] for block in blocks]


def test_run_keeps_the_last_snapshots_and_reports_greedy_and_beam(run) -> None:
    out, final = run["out_dir"], run["final"]
    assert snapshot_epochs(out) == [1, 2]
    assert final["averaged_epochs"] == [1, 2] and final["beam_size"] == 3
    for name in ("greedy", "beam"):
        assert 0.0 <= final[f"{name}_bleu"] <= 100.0 and final[f"{name}_seconds"] > 0
        assert len(final_hypotheses(out, name)) == SPLIT_SIZES["test"]
    assert (out / "final.json").is_file()
    assert run["history"][-1]["train_loss"] < run["history"][0]["train_loss"]


def test_averaged_parameters_are_the_mean_of_the_snapshots(run) -> None:
    out = run["out_dir"]
    averaged = average_snapshots(out, 2, 2)
    a, b = minitorch.load(out / "params_epoch1.npz"), minitorch.load(out / "params_epoch2.npz")
    assert set(averaged) == set(a)
    for name in a:
        np.testing.assert_allclose(averaged[name], (a[name].astype(np.float64) + b[name]) / 2, rtol=1e-6)
    with pytest.raises(FileNotFoundError, match=r"missing epochs \[0\]"):
        average_snapshots(out, 3, 2)


@pytest.mark.parametrize("name, beam", [("greedy", "1"), ("beam", "3")])
def test_translate_reproduces_the_final_evaluation(run, name: str, beam: str, capsys) -> None:
    """translate.py with the run's averaged parameters gives the final evaluation's translations."""
    out = run["out_dir"]
    sources = [de for de, _ in mt_corpus.read_split(run["corpus"], "test")]
    got = translate.main(["--checkpoint", str(out), "--backend", "cpu", "--beam-size", beam, "--batch-size", "5"] + sources)
    assert got == [translate.one_line(h) for h in final_hypotheses(out, name)]
    assert capsys.readouterr().out.splitlines() == got


def test_translate_reads_a_file_and_stdin_keeping_blank_lines(run, tmp_path, monkeypatch) -> None:
    out = str(run["out_dir"])
    sources = [de for de, _ in mt_corpus.read_split(run["corpus"], "test")][:3]
    lines = [sources[0], "", sources[1], "   ", sources[2]]
    file = tmp_path / "in.de"
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    greedy = ["--checkpoint", out, "--backend", "cpu", "--beam-size", "1"]
    from_file = translate.main(greedy + ["--file", str(file)])
    assert len(from_file) == 5 and from_file[1] == from_file[3] == ""
    assert from_file[0] and from_file[2] and from_file[4]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines)))
    assert translate.main(greedy) == from_file
    assert translate.main(greedy + sources) == [from_file[0], from_file[2], from_file[4]]


def test_translate_errors_name_the_problem(run, tmp_path) -> None:
    def fails(args, match, sentences=("Ein Hund.",)):
        with pytest.raises(SystemExit, match=match):
            translate.main(["--backend", "cpu"] + args + list(sentences))

    fails(["--checkpoint", str(tmp_path / "nowhere")], "no such directory")
    fails(["--checkpoint", str(tmp_path)], "has no checkpoint.npz: not an output directory")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "checkpoint.npz").write_bytes(b"not a checkpoint")
    fails(["--checkpoint", str(foreign)], "checkpoint.npz")
    out = str(run["out_dir"])
    fails(["--checkpoint", out, "--average-last", "3"], r"missing epochs \[0\]")
    fails(["--checkpoint", out, "--beam-size", "0"], "--beam-size and --batch-size must be >= 1")
    fails(["--checkpoint", out, "--file", str(tmp_path / "none.de")], "no such file", sentences=())
    fails(["--checkpoint", out, "--file", str(tmp_path / "none.de")], "not both")


@pytest.mark.parametrize("option, value", [("--label-smoothing", "1.5"), ("--length-penalty", "-1")])
def test_training_program_rejects_bad_values(option: str, value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        mt_options.build_parser().parse_args([option, value])
    assert option in capsys.readouterr().err
