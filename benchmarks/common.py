"""What every benchmark script shares: the repository root on sys.path, the results folders, timing
(buffer rotation for the GPU timer, minitorch.cuda.timer.gpu_ms, and the wall clock), the
device-to-device copy bandwidth, the printed table, and the JSON + PNG files a script leaves behind.

A script imports this module before any of the repository's own (`from common import ...`: Python
puts the script's folder, benchmarks/, on sys.path), so it runs as `python benchmarks/bench_x.py`
from any working directory. Results go to benchmarks/results/<script>/ unless `--out DIR` says
otherwise; benchmarks/results/runs/ keeps the program logs the README quotes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
PANEL_KINDS = ("bars", "barh", "stacked", "lines")


def out_option(parser: argparse.ArgumentParser, bench: str) -> None:
    """Add `--out DIR`: the folder of the script's results, by default benchmarks/results/<bench>."""
    parser.add_argument("--out", type=Path, default=RESULTS / bench,
                        help=f"folder of the results (default: benchmarks/results/{bench})")  # fmt: skip


# ---- timing ------------------------------------------------------------------------------------------
def rotating(fn: Callable[[int], Any]) -> Callable[[], Any]:
    """A call that runs fn(0), fn(1), fn(2), ... on successive calls (the index picks a buffer set)."""
    calls = itertools.count()
    return lambda: fn(next(calls))


def buffer_sets(set_bytes: int, l2_multiple: float = 3.0, most: int = 32) -> int:
    """How many input sets to rotate over so that together they hold `l2_multiple` times the GPU's L2
    cache (between 1 and `most`): consecutive calls then read DRAM, not L2."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or (50 << 20)
    return int(min(most, max(1, math.ceil(l2_multiple * l2 / max(set_bytes, 1)))))


@dataclass
class WallClock:
    """The wall-clock seconds of each timed call and the value every call returned (warm-up first)."""

    seconds: List[float]
    results: List[Any]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def wall_clock(fn: Callable[[], Any], reps: int, warmup: int = 0,
               sync: Optional[Callable[[], Any]] = None) -> WallClock:  # fmt: skip
    """Time `reps` calls of fn() after `warmup` untimed ones. `sync` (torch.cuda.synchronize for GPU
    work) runs before each timed call and, inside its time, after it, so a call's time covers the
    device work it queued; without it a call is timed as the host sees it."""
    results = [fn() for _ in range(warmup)]
    seconds = []
    for _ in range(reps):
        if sync is not None:
            sync()
        start = time.perf_counter()
        results.append(fn())
        if sync is not None:
            sync()
        seconds.append(time.perf_counter() - start)
    return WallClock(seconds, results)


def copy_gbps(n_floats: Optional[int] = None, reps: int = 7) -> float:
    """Device-to-device copy bandwidth in GB/s, counting the bytes read and written: dst.copy_(src) of
    n_floats float32 (default 1 GiB, less where a quarter of the free memory is smaller), timed with
    minitorch.cuda.timer.gpu_ms. The floor every memory-bound kernel is judged against."""
    import torch

    from minitorch.cuda.timer import gpu_ms

    if n_floats is None:
        n_floats = min(1 << 28, torch.cuda.mem_get_info()[0] // 16)
    src = torch.empty(n_floats, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = gpu_ms(lambda: dst.copy_(src), reps=reps)
    return 2 * n_floats * 4 / (ms * 1e-3) / 1e9


# ---- the printed table ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One column of a Table. `value` is a row's key or a function of the row; its cell is a string
    as it is, None as "-", or a number formatted with `fmt` (a format spec such as ".1f" or ",.0f")
    followed by `suffix` ("x", "%", " ms")."""

    title: str
    width: int
    value: Union[str, Callable[[Any], Any]]
    fmt: str = ""
    suffix: str = ""
    left: bool = False

    def cell(self, row: Any) -> str:
        value = row.get(self.value) if isinstance(self.value, str) else self.value(row)
        if value is None:
            text = "-"
        elif isinstance(value, str):
            text = value
        else:
            text = format(value, self.fmt) + self.suffix
        return text.ljust(self.width) if self.left else text.rjust(self.width)


class Table:
    """A fixed-width text table printed a row at a time (flushed, so a long run shows its progress)."""

    def __init__(self, *columns: Column) -> None:
        self.columns = columns

    def header(self) -> None:
        print(" ".join(c.title.ljust(c.width) if c.left else c.title.rjust(c.width) for c in self.columns))

    def line(self, row: Any, first: Optional[int] = None, note: str = "") -> str:
        """The row's cells (of the first `first` columns only, when given), then `note`."""
        cells = " ".join(c.cell(row) for c in self.columns[:first])
        return f"{cells} {note}".rstrip()

    def row(self, row: Any, first: Optional[int] = None, note: str = "") -> None:
        print(self.line(row, first, note), flush=True)


# ---- JSON and PNG --------------------------------------------------------------------------------------
@dataclass
class Panel:
    """One plot of a figure: named series with one value per entry of `x` (None: nothing drawn).

    kind "bars": a group of bars per category of x, one bar per series; "barh": the same lying down,
    the first category on top; "stacked": the series stacked on one bar per category; "lines": each
    series a line (with markers) over the numbers in x. `log` puts the value axis on a log scale,
    `x_log_base` the x axis of lines; `ref` draws a dashed line at that value (labelled `ref_label`);
    `notes` are texts at the ends of the bars of a one-series panel; `colors` are one per series, or
    one per bar for a single series.
    """

    x: Sequence[Any]
    series: Mapping[str, Sequence[Optional[float]]]
    kind: str = "bars"
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    log: bool = False
    x_log_base: Optional[int] = None
    ref: Optional[float] = None
    ref_label: str = ""
    notes: Optional[Sequence[str]] = None
    colors: Optional[Sequence[str]] = None
    rotation: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in PANEL_KINDS:
            raise ValueError(f"Panel kind {self.kind!r} is none of {PANEL_KINDS}")
        for name, values in self.series.items():
            if len(values) != len(self.x):
                raise ValueError(f"Panel series {name!r} has {len(values)} values for {len(self.x)} x entries")

    def draw(self, ax: Any) -> None:
        import numpy as np

        names = list(self.series)
        pos = np.arange(len(self.x))
        width = 0.8 if self.kind == "stacked" else 0.8 / max(len(names), 1)
        bottom = np.zeros(len(self.x))
        for i, name in enumerate(names):
            values = np.array([np.nan if v is None else float(v) for v in self.series[name]])
            label = name if len(names) > 1 else None  # a lone series is named by the axis label
            if self.kind == "lines":
                ax.plot(self.x, values, "o-", markersize=3, linewidth=1, label=label,
                        color=self.colors[i] if self.colors else None)  # fmt: skip
                continue
            color = None if not self.colors else self.colors if len(names) == 1 else self.colors[i]
            offset = 0.0 if self.kind == "stacked" else (i - (len(names) - 1) / 2) * width
            heights = np.nan_to_num(values)
            if self.kind == "barh":
                bars = ax.barh(pos + offset, heights, width, label=label, color=color)
            else:
                bars = ax.bar(pos + offset, heights, width, bottom=bottom, label=label, color=color)
            if self.kind == "stacked":
                bottom = bottom + heights
            for bar, note in zip(bars, self.notes or ()):
                self._note(ax, bar, note)
        self._axes(ax, pos, len(names) > 1)

    def _note(self, ax: Any, bar: Any, note: str) -> None:
        if self.kind == "barh":
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {note}", va="center", fontsize=8)
        else:
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height(), note, ha="center", va="bottom",
                    fontsize=8)  # fmt: skip

    def _axes(self, ax: Any, pos: Any, legend: bool) -> None:
        labels = [str(v) for v in self.x]
        if self.kind == "barh":
            ax.set_yticks(pos, labels)
            ax.invert_yaxis()
            if self.notes:
                ax.margins(x=0.5)  # room for the notes
        elif self.kind != "lines":
            tilt = {"rotation": self.rotation, "ha": "right"} if self.rotation else {}
            ax.set_xticks(pos, labels, fontsize=8, **tilt)
        if self.ref is not None:
            line = ax.axvline if self.kind == "barh" else ax.axhline
            line(self.ref, color="gray", lw=0.8, ls="--", label=self.ref_label or None)
        if self.log:
            (ax.set_xscale if self.kind == "barh" else ax.set_yscale)("log")
        if self.x_log_base:
            ax.set_xscale("log", base=self.x_log_base)
        if self.kind == "lines":
            ax.grid(alpha=0.3)
        ax.set(title=self.title, xlabel=self.xlabel, ylabel=self.ylabel)
        if legend or self.ref_label:
            ax.legend(fontsize=8)


def save_figure(path: Path, panels: Sequence[Panel], title: str = "", columns: Optional[int] = None,
                size: Optional[Tuple[float, float]] = None) -> None:  # fmt: skip
    """Draw the panels `columns` to a row (default: all in one row) and save the figure as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = columns or len(panels)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=size or (6.0 * columns, 4.5 * rows), squeeze=False)
    for panel, ax in zip(panels, axes.flat):
        panel.draw(ax)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(path: Path, data: Any) -> None:
    """Write data as indented JSON, atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def write_results(out: Path, name: str, report: Any, panels: Sequence[Panel] = (), **figure: Any) -> None:
    """out/<name>.json from the report and, given panels, out/<name>.png (save_figure's keyword
    arguments in `figure`); prints what was written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{name}.json", report)
    written = [out / f"{name}.json"]
    if panels:
        save_figure(out / f"{name}.png", panels, **figure)
        written.append(out / f"{name}.png")
    print("wrote " + " and ".join(str(p) for p in written))
