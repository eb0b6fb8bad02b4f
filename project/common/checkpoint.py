"""Checkpoints of a training run, in minitorch.save's format (a NumPy .npz archive, never a pickle).

A checkpoint holds a *kind* (which program wrote it, e.g. "machine_translation"), the run's
configuration (JSON values) and its state: nested dicts and lists of JSON values and numpy arrays.
It is the object {"format", "version", "kind", "config", "state"} written by minitorch.save
(atomically, the checkpoint it replaces kept as ``<name>.prev.npz``, so a checkpoint found
corrupted later still leaves the one before) and read by minitorch.load, which never runs code.
Dict keys come back as strings; tuples come back as lists.

    save_checkpoint(out / "checkpoint.npz", "gpt2", config, {"model": model.state_dict(), "step": 7})
    ckpt = load_checkpoint(out / "checkpoint.npz", "gpt2")   # CheckpointError names file and problem
    check_config(ckpt, {"n_layer": 12})                     # saved config must agree
    restore_optimizer(ckpt.path, optimizer, ckpt.state["optimizer"])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

import minitorch
from minitorch import Module
from minitorch.serialization import LoadError, previous_path

FORMAT = "minitorch-run-checkpoint"
VERSION = 2  # 1: the format's own .npz layout, before checkpoints were minitorch.save files
PICKLE_START = b"\x80"  # the PROTO opcode that starts every pickle of protocol 2 or later

__all__ = [
    "Checkpoint", "CheckpointError", "check_config", "describe", "load_checkpoint", "previous_path",
    "restore_optimizer", "save_checkpoint", "upgrade_moments",
]  # fmt: skip


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: where it came from, the program kind, its configuration and state."""

    path: Path
    kind: str
    config: Dict[str, Any]
    state: Dict[str, Any]


def _plain(value: Any, key: str, arrays: List[str]) -> Any:
    """value with str dict keys, lists for tuples and Python numbers for numpy scalars, the paths of
    its arrays appended to arrays; TypeError naming the path of anything else."""
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"checkpoint state {key}: object arrays cannot be stored without pickle")
        arrays.append(key)
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{key}/{k}" if key else str(k), arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{key}/{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"checkpoint state {key}: cannot store a {type(value).__name__} (JSON values and numpy arrays only)")


def save_checkpoint(path: str | os.PathLike, kind: str, config: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Write a checkpoint atomically; the one it replaces becomes previous_path(path).

    config: JSON values only; state: JSON values and numpy arrays, nested in dicts and lists."""
    path = Path(path)
    arrays: List[str] = []
    plain_config = _plain(dict(config), "", arrays)
    if arrays:
        raise TypeError(f"checkpoint config holds arrays ({', '.join(arrays)}); arrays belong in the state")
    payload = {"format": FORMAT, "version": VERSION, "kind": kind, "config": plain_config,
               "state": _plain(dict(state), "", arrays)}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    minitorch.save(payload, path, keep_previous=True)


def _read(path: Path) -> Dict[str, Any]:
    """The checkpoint object in a file, checked to be one (of any version and kind)."""
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): it is not a checkpoint")
    try:
        payload = minitorch.load(path)
    except LoadError as err:
        with open(path, "rb") as f:
            pickled = f.read(1) == PICKLE_START
        raise CheckpointError(f"{err}{' (it looks like a pickle, which this format never reads)' if pickled else ''}") from None
    except KeyError as err:
        raise CheckpointError(f"{path} is truncated or damaged: it lacks the entry {err} that its header names") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} was written by minitorch.save but is not a minitorch run checkpoint")
    return payload


def load_checkpoint(path: str | os.PathLike, kind: str) -> Checkpoint:
    """Read a checkpoint written by save_checkpoint for a program of this kind.

    Raises CheckpointError, naming the file, when it is missing, empty, truncated or corrupted,
    not a checkpoint (a pickle, another .npz), of another format version or of another kind."""
    path = Path(path)
    payload = _read(path)
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format version {payload.get('version')}; this program reads version {VERSION}"
        )
    if payload.get("kind") != kind:
        raise CheckpointError(f"{path} is a {payload.get('kind')!r} checkpoint, not a {kind!r} one")
    if not isinstance(payload.get("config"), dict) or not isinstance(payload.get("state"), dict):
        raise CheckpointError(f"{path} is truncated or damaged: it lacks the config or the state")
    return Checkpoint(path=path, kind=kind, config=payload["config"], state=payload["state"])


def describe(path: str | os.PathLike) -> str:
    """One line about a checkpoint file for messages: its kind and step/epoch, or why it is unusable."""
    try:
        payload = _read(Path(path))
    except CheckpointError as err:
        return f"unusable: {err}"
    state = payload.get("state") or {}
    progress = state.get("progress", state) if isinstance(state, dict) else {}
    where = ", ".join(f"{k} {progress[k]}" for k in ("epoch", "step") if isinstance(progress, dict) and k in progress)
    return f"a {payload.get('kind')!r} checkpoint" + (f" at {where}" if where else "")


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


def upgrade_moments(model: Module, saved_names: Sequence[str], optimizer_state: Dict[str, Any]) -> Dict[str, Any]:
    """Adam's state (moments keyed by parameter position) saved with a model whose parameters were
    saved_names, re-keyed for model: a checkpoint of an older parameter layout (separate q, k, v
    projections) gets its moments packed as its parameters are (Module.upgrade_state)."""
    names = [name for name, _ in model.named_parameters()]
    if list(saved_names) == names:
        return optimizer_state
    position = {name: i for i, name in enumerate(names)}
    out = dict(optimizer_state)
    for key in ("m", "v"):
        by_name = model.upgrade_state({saved_names[int(i)]: value for i, value in optimizer_state[key].items()})
        out[key] = {str(position[name]): value for name, value in by_name.items()}
    return out


def restore_optimizer(
    path: Path, optimizer: minitorch.Adam, saved: Dict[str, Any], model: Optional[Module] = None,
    saved_names: Optional[Sequence[str]] = None,
) -> None:  # fmt: skip
    """Load Adam's saved step count and moments into optimizer, after checking that every moment
    fits its parameter (CheckpointError naming the checkpoint file otherwise). With model and the
    names of the saved model's parameters, moments of an older parameter layout are upgraded first."""
    if model is not None and saved_names is not None:
        saved = upgrade_moments(model, saved_names, saved)
    n = len(optimizer.parameters)
    for key in ("m", "v"):
        for i, value in saved[key].items():
            if int(i) >= n or np.shape(value) != optimizer.parameters[int(i)].value.shape:
                raise CheckpointError(
                    f"{path}: AdamW moment {key} {i} of shape {np.shape(value)} does not fit parameter {i} of the "
                    f"model's {n}"
                )
    optimizer.load_state_dict(saved)
