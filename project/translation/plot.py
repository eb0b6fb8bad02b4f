"""Plot a translation run's metrics.jsonl (one record per epoch) to a PNG: train and validation loss,
test BLEU, and training tokens/s, each against the epoch.

    python -m project.translation.plot runs/mt/metrics.jsonl [--out runs/mt/metrics.png]

The training program calls plot_metrics() after each epoch, so <out-dir>/metrics.png always shows
the run so far.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from project.common.metrics import Panel, Series, plot_records, read_records

PANELS = (
    Panel("loss", "cross-entropy per target token", (Series("train_loss", "train"), Series("valid_loss", "validation", "s-"))),
    Panel("BLEU", "BLEU (sacrebleu, test)", (Series("bleu", color="tab:green"),)),
    Panel("throughput", "training tokens / s", (Series("tokens_per_s", color="tab:purple"),), from_zero=True),
)
REQUIRED = ("epoch", "train_loss", "valid_loss", "bleu", "tokens_per_s")


def plot_metrics(metrics_path: Path, out_path: Optional[Path] = None) -> Path:
    """Write the PNG of a metrics.jsonl (default: metrics.png beside it); returns its path.
    ValueError naming the file (and line) when it holds no records or a bad one."""
    metrics_path = Path(metrics_path)
    records = read_records(metrics_path, REQUIRED)
    if not records:
        raise ValueError(f"{metrics_path} holds no records to plot")
    out_path = metrics_path.with_suffix(".png") if out_path is None else Path(out_path)
    return plot_records(records, out_path, "epoch", PANELS, f"{metrics_path} ({len(records)} epochs)", integer_ticks=True)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def main(argv: Optional[Sequence[str]] = None) -> Path:
    """Plot the metrics file named on the command line; returns the PNG's path."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (None: metrics.png beside the input)")
    args = parser.parse_args(argv)
    out = plot_metrics(args.metrics, args.out)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
