"""project/common/checkpoint.py (the checkpoint file format) and project/common/control.py (save schedule,
graceful stop on SIGINT/SIGTERM)."""

import json
import os
import pickle
import signal
import zipfile
from pathlib import Path

import numpy as np
import pytest

import minitorch
from minitorch.serialization import HEADER
from project.common.checkpoint import (
    FORMAT,
    VERSION,
    CheckpointError,
    check_config,
    describe,
    load_checkpoint,
    previous_path,
    save_checkpoint,
)
from project.common.control import GracefulStop, SaveSchedule, StopRequested

CONFIG = {"n_embd": 32, "lr": 3e-3, "data_dir": None, "name": "tiny"}


def state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "model": {"embed.weights": rng.standard_normal((5, 3)).astype(np.float32), "ln.bias": np.zeros(3, np.float32)},
        "optimizer": {"t": 7, "m": {0: rng.standard_normal(4)}, "v": {0: np.ones(4)}},
        "rng": {"legacy": np.random.get_state(legacy=False), "pcg": rng.bit_generator.state},
        "progress": {"epoch": 1, "step": 9, "partial": {"loss_sum": 0.1 + 0.2, "n": np.int64(3), "lr": None}},
        "order": (1, 2, 3),
    }


def test_round_trip_is_exact_and_json_plus_npz(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.npz"
    saved = state()
    save_checkpoint(path, "mt", CONFIG, saved)
    loaded = load_checkpoint(path, "mt")
    assert loaded.config == CONFIG and loaded.kind == "mt" and loaded.path == path
    for name, value in saved["model"].items():
        got = loaded.state["model"][name]
        assert got.dtype == value.dtype and np.array_equal(got, value)
    assert np.array_equal(loaded.state["optimizer"]["m"]["0"], saved["optimizer"]["m"][0]), "int keys come back as str"
    assert loaded.state["progress"] == {"epoch": 1, "step": 9, "partial": {"loss_sum": 0.1 + 0.2, "n": 3, "lr": None}}
    assert loaded.state["order"] == [1, 2, 3]
    assert loaded.state["rng"]["pcg"] == saved["rng"]["pcg"], "128-bit generator state survives JSON"
    np.random.set_state(loaded.state["rng"]["legacy"])
    assert np.array_equal(np.random.get_state(legacy=False)["state"]["key"], saved["rng"]["legacy"]["state"]["key"])
    with np.load(path, allow_pickle=False) as npz:  # a plain .npz any numpy reads, no pickle inside
        entries = dict(json.loads(npz[HEADER].tobytes())["tree"]["dict"])  # minitorch.save's JSON header
        assert entries["format"]["value"] == FORMAT and entries["version"]["value"] == VERSION
        assert entries["kind"]["value"] == "mt"
        assert any(np.array_equal(npz[name], saved["model"]["embed.weights"]) for name in npz.files if name != HEADER)
    assert describe(path) == "a 'mt' checkpoint at epoch 1, step 9"


def test_replacing_keeps_the_previous_file_and_no_temporaries(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, "mt", CONFIG, state(0))
    first = path.read_bytes()
    (tmp_path / ".checkpoint.npz.dead.part").write_bytes(b"left by a killed writer")
    save_checkpoint(path, "mt", CONFIG, state(1))
    assert previous_path(path) == tmp_path / "checkpoint.prev.npz"
    assert previous_path(path).read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.npz", "checkpoint.prev.npz"]
    np.testing.assert_array_equal(load_checkpoint(path, "mt").state["model"]["ln.bias"], state(1)["model"]["ln.bias"])


def test_a_failed_write_leaves_both_files_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.npz"
    save_checkpoint(path, "mt", CONFIG, state(0))
    save_checkpoint(path, "mt", CONFIG, state(1))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(TypeError, match=r"checkpoint state model/bad: cannot store a object"):
        save_checkpoint(path, "mt", CONFIG, {"model": {"bad": object()}})
    with pytest.raises(TypeError, match="object arrays cannot be stored without pickle"):
        save_checkpoint(path, "mt", CONFIG, {"x": np.array([{}], dtype=object)})
    with pytest.raises(TypeError, match="config holds arrays"):
        save_checkpoint(path, "mt", {"w": np.zeros(2)}, {})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def corrupt_variants(good: bytes) -> dict:
    """name -> (bytes, the message expected when loading them)."""
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    return {
        "empty": (b"", r"is empty \(0 bytes\)"),
        "truncated": (good[: len(good) // 2], r"is truncated or damaged \(BadZipFile"),
        "flipped byte": (bytes(flipped), r"is truncated or damaged"),
        "pickle": (pickle.dumps({"model": 1}), r"not a NumPy \.npz archive \(it looks like a pickle"),
        "text": (b"hello\n", r"not a file written by minitorch\.save: not a NumPy \.npz archive"),
    }


@pytest.mark.parametrize("variant", ["empty", "truncated", "flipped byte", "pickle", "text"])
def test_unusable_files_are_refused_naming_the_file(tmp_path: Path, variant: str) -> None:
    good_path = tmp_path / "good.npz"
    save_checkpoint(good_path, "mt", CONFIG, state())
    data, message = corrupt_variants(good_path.read_bytes())[variant]
    path = tmp_path / "checkpoint.npz"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=rf"^{path}.*{message}") as info:
        load_checkpoint(path, "mt")
    assert "\n" not in str(info.value)
    assert describe(path).startswith("unusable: ")


def test_foreign_archives_other_versions_and_kinds_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"x\.npz is a \.npz file without a __minitorch__ entry"):
        load_checkpoint(path, "mt")
    minitorch.save({"format": "other", "weights": np.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="not a minitorch run checkpoint"):
        load_checkpoint(path, "mt")
    save_checkpoint(path, "gpt2", CONFIG, state())
    with pytest.raises(CheckpointError, match=r"x\.npz is a 'gpt2' checkpoint, not a 'mt' one"):
        load_checkpoint(path, "mt")
    minitorch.save({"format": FORMAT, "version": 99, "kind": "mt", "config": {}, "state": {}}, path)
    with pytest.raises(CheckpointError, match=rf"has checkpoint format version 99; this program reads version {VERSION}"):
        load_checkpoint(path, "mt")
    with zipfile.ZipFile(tmp_path / "y.npz", "w") as z:  # a header naming an array that is not there
        tree = {"dict": [["format", {"value": FORMAT}], ["version", {"value": VERSION}], ["kind", {"value": "mt"}],
                         ["config", {"dict": []}], ["state", {"dict": [["w", {"array": "w"}]]}]]}  # fmt: skip
        header = {"format": "minitorch", "version": 1, "tree": tree}
        with z.open(HEADER + ".npy", "w") as f:
            np.lib.format.write_array(f, np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    with pytest.raises(CheckpointError, match=r"y\.npz is truncated or damaged: it lacks the entry 'w' that its header names"):
        load_checkpoint(tmp_path / "y.npz", "mt")
    with pytest.raises(CheckpointError, match=r"absent\.npz does not exist"):
        load_checkpoint(tmp_path / "absent.npz", "mt")


def test_check_config_lists_every_difference(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "c.npz", "mt", CONFIG, {})
    checkpoint = load_checkpoint(tmp_path / "c.npz", "mt")
    check_config(checkpoint, {"n_embd": 32, "name": "tiny"})
    with pytest.raises(CheckpointError, match=r"c\.npz was saved with another configuration.* asks for "
                                              r"--n-embd 64 \(saved: 32\), --lr 0\.1 \(saved: 0\.003\)"):
        check_config(checkpoint, {"n_embd": 64, "lr": 0.1, "name": "tiny"}, lambda k: "--" + k.replace("_", "-"))


def test_save_schedule_by_steps_and_minutes() -> None:
    now = [0.0]
    schedule = SaveSchedule(every_steps=3, every_minutes=0.5, clock=lambda: now[0])
    assert [schedule.due(s) for s in range(1, 7)] == [False, False, True, False, False, True]
    now[0] = 31.0
    assert schedule.due(1)
    schedule.saved()
    assert not schedule.due(1)
    assert not any(SaveSchedule(clock=lambda: now[0]).due(s) for s in range(1, 100))
    with pytest.raises(ValueError, match="save intervals must be >= 0"):
        SaveSchedule(every_steps=-1)


def test_graceful_stop_flags_then_interrupts_then_quits(capsys) -> None:
    before = signal.getsignal(signal.SIGINT)
    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == "SIGTERM", "the first signal only sets the flag"
        assert "SIGTERM received: stopping after this step" in capsys.readouterr().err
        with pytest.raises(StopRequested):
            with stop.interruptible():  # a pending request ends an interruptible block at once
                pass
        with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before, "handlers are restored"
    with GracefulStop() as stop:
        with pytest.raises(StopRequested):
            with stop.interruptible():
                os.kill(os.getpid(), signal.SIGINT)
                raise AssertionError("the signal should have ended the block")
        assert stop.requested == "SIGINT"
