"""minitorch.save / minitorch.load: round trips of tensors, state dicts and nested containers, the file
being a plain .npz that NumPy reads without pickle, and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from minitorch_testing import FAST, SIMPLE, assert_close, mt

import minitorch


def test_tensor_round_trip_keeps_values_dtype_and_grad_flag(tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    path = tmp_path / "x.mt"
    minitorch.save(mt(x, FAST, requires_grad=True).T, path)
    loaded = minitorch.load(path)
    assert loaded.shape == (4, 3) and loaded.requires_grad() and loaded.is_leaf()
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
