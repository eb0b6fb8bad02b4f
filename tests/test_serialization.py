"""minitorch.save / minitorch.load: round trips of tensors, state dicts and nested containers, the file
being a plain .npz that NumPy reads without pickle, the errors, and atomic_write (a failed write
leaves the old file, the previous file kept on request)."""

from __future__ import annotations

import io
import json
import os
import pickle
import stat

import numpy as np
import pytest
from minitorch_testing import FAST, SIMPLE, assert_close, mt

import minitorch
from minitorch import serialization
from minitorch.serialization import LoadError, atomic_write


def test_tensor_round_trip_keeps_values_dtype_and_grad_flag(tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    path = tmp_path / "x.mt"
    minitorch.save(mt(x, FAST, requires_grad=True).T, path)
    loaded = minitorch.load(path)
    assert loaded.shape == (4, 3) and loaded.requires_grad and loaded.is_leaf
    np.testing.assert_array_equal(loaded.to_numpy(), x.T)
    minitorch.save(mt(x, FAST) > 0.0, path)
    mask = minitorch.load(path, backend=SIMPLE)
    assert mask.dtype == minitorch.bool and mask.backend is SIMPLE
    np.testing.assert_array_equal(mask.numpy(), x > 0.0)


def test_nested_containers_round_trip(tmp_path) -> None:
    obj = {
        "step": 7, "lr": 1e-3, "name": "run", "flag": True, "none": None,
        "weights": [mt(np.ones((2, 2)), FAST), (np.arange(3, dtype=np.int64), np.float32(2.5))],
        "nested": {"a.b": mt(np.zeros(0), FAST), "ids": np.array([[1, 2]], dtype=np.int32)},
    }  # fmt: skip
    minitorch.save(obj, tmp_path / "obj.npz")
    back = minitorch.load(tmp_path / "obj.npz")
    assert {k: back[k] for k in ("step", "lr", "name", "flag", "none")} == {
        "step": 7, "lr": 1e-3, "name": "run", "flag": True, "none": None
    }
    assert isinstance(back["weights"], list) and isinstance(back["weights"][1], tuple)
    np.testing.assert_array_equal(back["weights"][0].to_numpy(), np.ones((2, 2)))
    assert back["weights"][1][0].dtype == np.int64 and back["weights"][1][1] == 2.5
    assert back["nested"]["a.b"].shape == (0,) and back["nested"]["ids"].dtype == np.int32


def test_state_dict_saved_and_loaded_into_a_new_model(tmp_path) -> None:
    minitorch.manual_seed(1)
    model = minitorch.DecoderLM(n_vocab=11, n_embd=8, n_head=2, n_positions=6, n_layers=1, p_dropout=0.0)
    ids = minitorch.tensor([[1.0, 4.0, 2.0]])
    expected = model(ids).to_numpy()
    minitorch.save(model.state_dict(), tmp_path / "model.npz")
    minitorch.manual_seed(2)
    fresh = minitorch.DecoderLM(n_vocab=11, n_embd=8, n_head=2, n_positions=6, n_layers=1, p_dropout=0.0)
    fresh.load_state_dict(minitorch.load(tmp_path / "model.npz"))
    assert_close(fresh(ids), expected, "model after load", tol=1e-7)


def test_the_file_is_plain_npz_without_pickle(tmp_path) -> None:
    minitorch.save({"w": mt(np.arange(4.0), FAST)}, tmp_path / "w.npz")
    with np.load(tmp_path / "w.npz", allow_pickle=False) as archive:
        header = json.loads(archive["__minitorch__"].tobytes().decode())
        assert header["format"] == "minitorch" and header["version"] == 1
        key = header["tree"]["dict"][0][1]["tensor"]
        np.testing.assert_array_equal(archive[key], np.arange(4.0, dtype=np.float32))


def test_save_and_load_errors(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"the object\['bad'\] is a NumPy array of Python objects"):
        minitorch.save({"bad": np.array([object()])}, tmp_path / "a.npz")
    with pytest.raises(TypeError, match="has a key 3 of type int; keys must be str"):
        minitorch.save({3: 1.0}, tmp_path / "a.npz")
    with pytest.raises(TypeError, match=r"the object\[0\] is a set"):
        minitorch.save([{1}], tmp_path / "a.npz")
    np.savez(tmp_path / "plain.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="without a __minitorch__ entry: not written by minitorch.save"):
        minitorch.load(tmp_path / "plain.npz")


def test_save_into_an_existing_file_leaves_no_temporaries_and_keeps_the_previous_one_on_request(tmp_path) -> None:
    path = tmp_path / "ckpt.npz"
    minitorch.save({"step": 1}, path)
    minitorch.save({"step": 2}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.npz"]
    minitorch.save({"step": 3}, path, keep_previous=True)
    assert minitorch.load(path) == {"step": 3}
    assert minitorch.load(tmp_path / "ckpt.prev.npz") == {"step": 2}
    assert serialization.previous_path(path) == tmp_path / "ckpt.prev.npz"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.npz", "ckpt.prev.npz"]


@pytest.mark.parametrize("crash", [OSError("disk full"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path, crash: BaseException) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"old contents")

    def write(f) -> None:
        f.write(b"half of the new ")
        raise crash

    with pytest.raises(type(crash)):
        atomic_write(path, write, keep_previous=True)
    assert path.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin"]


def test_atomic_write_replaces_keeps_previous_and_removes_stale_temporaries(tmp_path) -> None:
    path = tmp_path / "data.bin"
    assert atomic_write(path, lambda f: f.write(b"first")) == path
    (tmp_path / ".data.bin.dead.part").write_bytes(b"left by a killed writer")
    (tmp_path / ".data.prev.bin.dead.part").write_bytes(b"left by a killed writer")
    atomic_write(path, lambda f: f.write(b"second"), keep_previous=True)
    assert path.read_bytes() == b"second" and (tmp_path / "data.prev.bin").read_bytes() == b"first"
    atomic_write(path, lambda f: f.write(b"third"), keep_previous=True)
    assert path.read_bytes() == b"third" and (tmp_path / "data.prev.bin").read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.bin", "data.prev.bin"]


def test_atomic_write_gives_the_permissions_open_would(tmp_path) -> None:
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "a.bin", lambda f: f.write(b"x"))
        with open(tmp_path / "b.bin", "wb") as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == stat.S_IMODE((tmp_path / "b.bin").stat().st_mode)


DAMAGED = {
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "a pickle": lambda good: pickle.dumps({"step": 1}),
    "text": lambda good: b"step = 1\n",
    "a .npy array": lambda good: _npy_bytes(),
    "flipped bytes": lambda good: good[:200] + bytes(b ^ 0xFF for b in good[200:260]) + good[260:],
}


def _npy_bytes() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(3))
    return buffer.getvalue()


@pytest.mark.parametrize("damage", DAMAGED)
def test_loading_a_foreign_or_damaged_file_is_one_clear_error_naming_it(tmp_path, damage: str) -> None:
    good = tmp_path / "good.npz"
    minitorch.save({"w": mt(np.arange(64.0), FAST), "step": 3}, good)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(DAMAGED[damage](good.read_bytes()))
    with pytest.raises(LoadError) as error:
        minitorch.load(bad)
    message = str(error.value)
    assert message.startswith(str(bad)) and "pickle" not in message.lower()


def test_another_format_version_and_a_missing_file(tmp_path) -> None:
    header = json.dumps({"format": "minitorch", "version": 99, "tree": {"value": 1}}).encode()
    np.savez(tmp_path / "v99.npz", __minitorch__=np.frombuffer(header, dtype=np.uint8))
    with pytest.raises(LoadError, match=r"v99.npz: format 'minitorch' version 99; this minitorch reads 'minitorch' versions 1 and 2"):
        minitorch.load(tmp_path / "v99.npz")
    with pytest.raises(FileNotFoundError, match="absent.npz"):
        minitorch.load(tmp_path / "absent.npz")
