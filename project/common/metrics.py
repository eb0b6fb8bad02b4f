"""A training run's metrics: a JSON-lines log (one record per line) and its plots.

    log = MetricsLog(out_dir / "metrics.jsonl")
    history = log.restart(lambda r: r["step"] <= step)  # a resumed run drops what came after its checkpoint
    log.append({"step": 1, "loss": 2.5})
    plot_records(read_records(log.path), out_dir / "loss.png", "step", [Panel("loss", "loss", [Series("loss")])])
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

Record = Dict[str, Any]


def read_records(path: str | os.PathLike, required: Sequence[str] = ()) -> List[Record]:
    """The records of a metrics file, in file order; ValueError naming the file and line of one that
    is not a JSON object or lacks a required key."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
            missing = [key for key in required if key not in record]
            if missing:
                raise ValueError(f"{path}:{number}: record lacks {missing}")
            records.append(record)
    return records


class MetricsLog:
    """The metrics file of a run, written only where `write` (rank 0 of a data-parallel run)."""

    def __init__(self, path: str | os.PathLike, write: bool = True):
        self.path, self.write = Path(path), write

    def restart(self, keep: Optional[Callable[[Record], bool]] = None) -> List[Record]:
        """Start the file anew with the records already in it that keep() accepts (none without
        keep), and return them: a run resumed from a checkpoint keeps those up to it (a crash after
        a record but before its checkpoint leaves one that the run writes again)."""
        records = [r for r in read_records(self.path) if keep(r)] if keep is not None and self.path.is_file() else []
        if self.write:
            with open(self.path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        return records

    def append(self, record: Record) -> None:
        """Add one record at the end of the file."""
        if self.write:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


@dataclass(frozen=True)
class Series:
    """One line of a panel: the records' `key` against the x key (records without it are skipped)."""

    key: str
    label: Optional[str] = None
    style: str = "o-"
    color: Optional[str] = None


@dataclass(frozen=True)
class Panel:
    """One plot of a figure: a title, the y axis's label and its lines."""

    title: str
    ylabel: str
    series: Sequence[Series] = field(default_factory=tuple)
    from_zero: bool = False  # the y axis starts at 0


def plot_records(
    records: Sequence[Mapping[str, Any]], path: str | os.PathLike, x: str, panels: Sequence[Panel], title: str,
    integer_ticks: bool = False,
) -> Path:  # fmt: skip
    """Write a PNG of the records' panels side by side, each against the x key; returns its path.
    integer_ticks: a tick at every x value (few of them, e.g. epochs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.7 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for series in panel.series:
            points = [(r[x], r[series.key]) for r in records if series.key in r and x in r]
            if points:
                ax.plot(*zip(*points), series.style, label=series.label, color=series.color, linewidth=1)
        ax.set_title(panel.title)
        ax.set_xlabel(x)
        ax.set_ylabel(panel.ylabel)
        if panel.from_zero:
            ax.set_ylim(bottom=0)
        if integer_ticks:
            ax.set_xticks(sorted({r[x] for r in records if x in r}))
        if any(series.label for series in panel.series):
            ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
