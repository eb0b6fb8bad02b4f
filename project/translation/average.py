"""Per-epoch parameter snapshots and their average (checkpoint averaging).

With `--average-last N` the translation program writes the model's parameters after every epoch to
``<out-dir>/params_epoch{E}.npz`` (a state dict of float32 arrays, minitorch.save), keeps the last N, and
evaluates the element-wise mean of those N at the end: a cheap ensemble of the last points of the
trajectory. These files hold parameters only; the resumable training state is the checkpoint.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List

import numpy as np

import minitorch

SNAPSHOT_RE = re.compile(r"params_epoch(\d+)\.npz")


def snapshot_path(out_dir: str | os.PathLike, epoch: int) -> Path:
    return Path(out_dir) / f"params_epoch{epoch}.npz"


def snapshot_epochs(out_dir: str | os.PathLike) -> List[int]:
    """Epochs that have a snapshot in out_dir, ascending."""
    directory = Path(out_dir)
    if not directory.is_dir():
        return []
    found = (SNAPSHOT_RE.fullmatch(p.name) for p in directory.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def save_snapshot(out_dir: str | os.PathLike, epoch: int, state: Dict[str, np.ndarray], keep: int) -> Path:
    """Write state (a Module.state_dict()) as the snapshot of `epoch` (minitorch.save, atomic), then
    delete the snapshots of epochs before epoch - keep + 1."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    path = snapshot_path(out_dir, epoch)
    minitorch.save({name: np.asarray(value, dtype=np.float32) for name, value in state.items()}, path)
    for old in snapshot_epochs(out_dir):
        if old <= epoch - keep:
            snapshot_path(out_dir, old).unlink()
    return path


def average_snapshots(out_dir: str | os.PathLike, last: int, up_to_epoch: int) -> Dict[str, np.ndarray]:
    """The mean (accumulated in float64, returned as float32) of the snapshots of epochs
    up_to_epoch - last + 1 .. up_to_epoch; FileNotFoundError naming the missing ones."""
    epochs = list(range(up_to_epoch - last + 1, up_to_epoch + 1))
    missing = [e for e in epochs if e < 1 or not snapshot_path(out_dir, e).is_file()]
    if missing:
        raise FileNotFoundError(
            f"averaging the last {last} epochs needs snapshots of epochs {epochs[0]}..{epochs[-1]} in {out_dir}, "
            f"missing epochs {missing} (snapshots are written by training with --average-last {last} or more; "
            f"present: {snapshot_epochs(out_dir) or 'none'})"
        )
    total: Dict[str, np.ndarray] = {}
    for epoch in epochs:
        snapshot = minitorch.load(snapshot_path(out_dir, epoch))
        if total and set(snapshot) != set(total):
            raise ValueError(f"{snapshot_path(out_dir, epoch)} holds other parameters than epoch {epochs[0]}'s")
        for name, value in snapshot.items():
            total[name] = total.get(name, 0.0) + value.astype(np.float64)
    return {name: (value / len(epochs)).astype(np.float32) for name, value in total.items()}
