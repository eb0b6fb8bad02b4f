"""Checkpoints of a training run: one NumPy ``.npz`` archive, never a pickle.

A checkpoint holds a *kind* (which program wrote it, e.g. "machine_translation"), the run's
configuration (a JSON object) and its state: nested dicts and lists of JSON values (numbers, strings,
booleans, None) and numpy arrays. The arrays are stored as the archive's members, named by their
path in the state ("model/layers.0.weights"); everything else, with the format name and version, is
one JSON document in the member ``__meta__`` (UTF-8 bytes as a uint8 array). Reading uses
``np.load(allow_pickle=False)``, so loading a checkpoint never runs code. Dict keys come back as
strings; tuples come back as lists.

Writing is atomic: a temporary file beside the target, flushed and fsynced, then renamed over it.
The checkpoint it replaces is kept as ``<name>.prev.npz`` (a hard link, so there is always a
complete file under each name), so a checkpoint found corrupted later still leaves the one before.

    save_checkpoint(out / "checkpoint.npz", "gpt2", config, {"model": model.state_dict(), "step": 7})
    ckpt = load_checkpoint(out / "checkpoint.npz", "gpt2")   # CheckpointError names file and problem
    check_config(ckpt, {"n_layer": 12})                     # saved config must agree
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict

import numpy as np

FORMAT = "minitorch-run-checkpoint"
VERSION = 1
META_KEY = "__meta__"
ARRAY_TAG = "__array__"  # {"__array__": member name} stands for an array in the JSON state
ZIP_MAGIC = b"PK\x03\x04"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: where it came from, the program kind, its configuration and state."""

    path: Path
    kind: str
    config: Dict[str, Any]
    state: Dict[str, Any]


def previous_path(path: str | os.PathLike) -> Path:
    """Where save_checkpoint keeps the checkpoint it replaced: checkpoint.npz -> checkpoint.prev.npz."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def _split(value: Any, key: str, arrays: Dict[str, np.ndarray]) -> Any:
    """JSON form of value, with each numpy array moved into arrays under its path."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"checkpoint state {key}: object arrays cannot be stored without pickle")
        if key in arrays:
            raise ValueError(f"checkpoint state {key}: two arrays have this name")
        arrays[key] = value
        return {ARRAY_TAG: key}
    if isinstance(value, Mapping):
        if ARRAY_TAG in value:
            raise ValueError(f"checkpoint state {key}: the key {ARRAY_TAG!r} is reserved")
        return {str(k): _split(v, f"{key}/{k}" if key else str(k), arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_split(v, f"{key}/{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"checkpoint state {key}: cannot store a {type(value).__name__} (JSON values and numpy arrays only)")


def _join(value: Any, arrays: Mapping[str, np.ndarray], path: Path) -> Any:
    """Inverse of _split."""
    if isinstance(value, dict):
        if set(value) == {ARRAY_TAG}:
            name = value[ARRAY_TAG]
            if name not in arrays:
                raise CheckpointError(f"{path} is truncated or corrupted: its array {name!r} is missing")
            return arrays[name]
        return {k: _join(v, arrays, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_join(v, arrays, path) for v in value]
    return value


def _fsync_directory(directory: Path) -> None:
    """Make a rename in directory durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _keep_previous(path: Path) -> None:
    """Make previous_path(path) another name of the current file (a copy where links fail)."""
    prev = previous_path(path)
    tmp = prev.with_name(f".{prev.name}.{os.getpid()}.part")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
    os.replace(tmp, prev)


def _remove_stale_temporaries(path: Path) -> None:
    """Temporary files left by a writer that was killed (one writer per checkpoint is assumed)."""
    for pattern in (f".{path.name}.*.part", f".{previous_path(path).name}.*.part"):
        for stale in path.parent.glob(pattern):
            stale.unlink(missing_ok=True)


def save_checkpoint(path: str | os.PathLike, kind: str, config: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Write a checkpoint atomically; the one it replaces becomes previous_path(path).

    config: JSON values only; state: JSON values and numpy arrays, nested in dicts and lists."""
    path = Path(path)
    arrays: Dict[str, np.ndarray] = {}
    meta = {"format": FORMAT, "version": VERSION, "kind": kind, "config": _split(dict(config), "", arrays)}
    if arrays:
        raise TypeError(f"checkpoint config holds arrays ({', '.join(arrays)}); arrays belong in the state")
    meta["state"] = _split(dict(state), "", arrays)
    meta_bytes = json.dumps(meta).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, allow_pickle=False, **{META_KEY: np.frombuffer(meta_bytes, dtype=np.uint8)}, **arrays)
            f.flush()
            os.fsync(f.fileno())
        if path.is_file():
            _keep_previous(path)
        os.replace(tmp_name, path)
        _fsync_directory(path.parent)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _read(path: Path) -> tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(metadata, arrays) of a checkpoint file, every member read (so zip CRCs are checked)."""
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): it is not a checkpoint")
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC))
    if head != ZIP_MAGIC:
        hint = " (it looks like a pickle, which this format never reads)" if head[:1] == b"\x80" else ""
        raise CheckpointError(f"{path} is not a minitorch checkpoint: not a NumPy .npz archive{hint}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if META_KEY not in npz.files:
                raise CheckpointError(f"{path} is an .npz archive without minitorch checkpoint metadata (a foreign file)")
            meta = json.loads(npz[META_KEY].tobytes().decode("utf-8"))
            arrays = {name: npz[name] for name in npz.files if name != META_KEY}
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError) as err:
        raise CheckpointError(f"{path} is truncated or corrupted ({type(err).__name__}: {err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} is an .npz archive but not a minitorch run checkpoint (a foreign file)")
    return meta, arrays


def load_checkpoint(path: str | os.PathLike, kind: str) -> Checkpoint:
    """Read a checkpoint written by save_checkpoint for a program of this kind.

    Raises CheckpointError, naming the file, when it is missing, empty, truncated or corrupted,
    not a checkpoint (a pickle, another .npz), of another format version or of another kind."""
    path = Path(path)
    meta, arrays = _read(path)
    if meta.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {meta.get('version')}; this program reads version {VERSION}"
        )
    if meta.get("kind") != kind:
        raise CheckpointError(f"{path} is a {meta.get('kind')!r} checkpoint, not a {kind!r} one")
    if not isinstance(meta.get("config"), dict) or not isinstance(meta.get("state"), dict):
        raise CheckpointError(f"{path} is truncated or corrupted: its metadata lacks the config or the state")
    return Checkpoint(path=path, kind=kind, config=meta["config"], state=_join(meta["state"], arrays, path))


def describe(path: str | os.PathLike) -> str:
    """One line about a checkpoint file for messages: its kind and step/epoch, or why it is unusable."""
    try:
        meta, _ = _read(Path(path))
    except CheckpointError as err:
        return f"unusable: {err}"
    state = meta.get("state") or {}
    progress = state.get("progress", state) if isinstance(state, dict) else {}
    where = ", ".join(f"{k} {progress[k]}" for k in ("epoch", "step") if isinstance(progress, dict) and k in progress)
    return f"a {meta.get('kind')!r} checkpoint" + (f" at {where}" if where else "")


def check_config(
    checkpoint: Checkpoint, requested: Mapping[str, Any], name: Callable[[str], str] = str
) -> None:
    """Raise CheckpointError listing every requested setting that differs from the saved config.
    name(key) spells a key for the message (e.g. as a command-line option)."""
    conflicts = [
        f"{name(key)} {value} (saved: {checkpoint.config.get(key)})"
        for key, value in requested.items()
        if checkpoint.config.get(key) != value
    ]
    if conflicts:
        raise CheckpointError(
            f"{checkpoint.path} was saved with another configuration; resuming continues it, but the "
            f"command line asks for {', '.join(conflicts)}"
        )
