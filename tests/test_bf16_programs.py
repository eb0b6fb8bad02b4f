"""Both programs with --dtype bf16 on the CPU (bf16 emulated with the GPU's rounding), tiny models:
they train, keep float32 master weights in their checkpoints, resume exactly, continue in the other
dtype, and decode in bf16; train_gpt2.py writes llm.c's bfloat16 model file (version 5) and starts
from one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from mt_program import TINY, assert_same_training_state, computed, load, run_until_first_save
from test_train_gpt2 import FRESH, tiny_args, word_shards
from test_translate import final_hypotheses

from project.common.checkpoint import load_checkpoint
from project.gpt2.llmc import read_checkpoint
from project.gpt2.main import main as train_gpt2
from project.translation import corpus as mt_corpus
from project.translation import main as run_mt
from project.translation import translate

MT_BF16 = TINY + ["--epochs", "2", "--dtype", "bf16", "--average-last", "2", "--final-beam-size", "2"]


def is_bf16(values: np.ndarray) -> bool:
    values = np.asarray(values, dtype=np.float32)
    return bool(np.array_equal(values, values.astype(ml_dtypes.bfloat16).astype(np.float32)))


def version(path: Path) -> int:
    return int(np.fromfile(path, dtype="<i4", count=2)[1])


# ---- translation --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mt_bf16(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("mt_bf16")
    return run_mt.main(MT_BF16 + ["--data-dir", str(corpus_dir), "--out-dir", str(out)])


def test_translation_trains_in_bf16_keeping_float32_masters(mt_bf16) -> None:
    first, second = mt_bf16["history"]
    assert second["train_loss"] < first["train_loss"] and second["valid_loss"] < first["valid_loss"]
    state = load(mt_bf16["out_dir"])
    assert state["args"]["dtype"] == "bf16"
    params = state["model"]
    assert all(np.asarray(v).dtype == np.float32 for v in params.values())
    assert not all(is_bf16(v) for v in params.values()), "the checkpoint holds the float32 masters"
    assert mt_bf16["final"]["greedy_bleu"] >= 0.0


def test_translation_bf16_resumes_exactly_and_continues_in_float32(mt_bf16, corpus_dir, tmp_path, monkeypatch) -> None:
    out = tmp_path / "resumed"
    run_until_first_save(MT_BF16 + ["--data-dir", str(corpus_dir), "--out-dir", str(out)], monkeypatch)
    epoch_one = shutil.copytree(out, tmp_path / "epoch_one")

    resumed = run_mt.main(["--resume", "--out-dir", str(out), "--data-dir", str(corpus_dir)])
    assert_same_training_state(load(mt_bf16["out_dir"]), load(out))
    assert computed(resumed["history"]) == computed(mt_bf16["history"])

    in_fp32 = run_mt.main(["--resume", "--out-dir", str(epoch_one), "--data-dir", str(corpus_dir), "--dtype", "fp32"])
    assert [r["epoch"] for r in in_fp32["history"]] == [1, 2] and in_fp32["config"]["dtype"] == "fp32"
    assert load(epoch_one)["args"]["dtype"] == "fp32"
    fp32_loss, bf16_loss = in_fp32["history"][1]["train_loss"], mt_bf16["history"][1]["train_loss"]
    assert abs(fp32_loss - bf16_loss) < 0.05 * bf16_loss


def test_translate_decodes_in_the_runs_bf16_as_its_final_evaluation(mt_bf16, corpus_dir, capsys) -> None:
    """translate.py on the bf16 run (its --dtype by default, the averaged parameters) gives the final
    evaluation's greedy translations; --dtype fp32 decodes the same checkpoint in float32."""
    out = mt_bf16["out_dir"]
    sources = [de for de, _ in mt_corpus.read_split(corpus_dir, "test")]
    lines = translate.main(["--checkpoint", str(out), "--backend", "cpu", "--beam-size", "1", *sources])
    assert lines == [translate.one_line(h) for h in final_hypotheses(out, "greedy")]
    assert len(translate.main(["--checkpoint", str(out), "--backend", "cpu", "--dtype", "fp32", *sources[:2]])) == 2
    capsys.readouterr()


# ---- GPT-2 --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return word_shards(tmp_path_factory.mktemp("gpt2_bf16"))


def losses(run: Path) -> list:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_train_gpt2_bf16_writes_llmc_bf16_and_resumes_exactly_in_either_dtype(shards, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    train_gpt2(tiny_args(shards, run, *FRESH, "--vocab-size", str(shards.vocab_size), "--dtype", "bf16"))
    assert "dtype bf16" in capsys.readouterr().out
    assert version(run / "model.bin") == 5 and version(run / "checkpoint_000002" / "model.bin") == 5
    config, params = read_checkpoint(run / "model.bin")
    assert all(is_bf16(v) for v in params.values())
    masters = load_checkpoint(run / "checkpoint_000004" / "state.npz", "gpt2").state["master_weights"]
    assert not all(is_bf16(v) for v in masters.values()), "the run checkpoint keeps the float32 masters"
    for name, value in masters.items():
        np.testing.assert_array_equal(params[name], np.asarray(value).astype(ml_dtypes.bfloat16).astype(np.float32))

    resumed = tmp_path / "resumed"
    train_gpt2(tiny_args(shards, resumed, "--resume-from", str(run / "checkpoint_000002"), "--dtype", "bf16"))
    assert (resumed / "model.bin").read_bytes() == (run / "model.bin").read_bytes()
    assert losses(resumed) == losses(run)[2:]
    again = load_checkpoint(resumed / "checkpoint_000004" / "state.npz", "gpt2").state["master_weights"]
    for name, value in masters.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)

    in_fp32 = tmp_path / "in_fp32"
    train_gpt2(tiny_args(shards, in_fp32, "--resume-from", str(run / "checkpoint_000002"), "--dtype", "fp32"))
    assert version(in_fp32 / "model.bin") == 3
    np.testing.assert_allclose(losses(in_fp32), losses(run)[2:], rtol=2e-3)
    back = tmp_path / "back"
    train_gpt2(tiny_args(shards, back, "--resume-from", str(in_fp32 / "checkpoint_000004"), "--dtype", "bf16",
                         "--steps", "5"))  # fmt: skip
    assert version(back / "model.bin") == 5 and len(losses(back)) == 1

    init = tmp_path / "init"
    train_gpt2(tiny_args(shards, init, "--init-from", str(run / "model.bin"), "--steps", "1"))
    assert version(init / "model.bin") == 3 and read_checkpoint(init / "model.bin")[0] == config
