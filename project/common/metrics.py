"""Plot a translation run's metrics.jsonl (one JSON record per epoch) to a PNG: train and validation
loss, test BLEU, and training tokens/s, each against the epoch.

    python project/plot_metrics.py runs/mt/metrics.jsonl [--out runs/mt/metrics.png]

run_machine_translation.py calls plot_metrics() after each epoch, so <out-dir>/metrics.png always
shows the run so far.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence


def read_records(path: Path) -> List[Dict[str, Any]]:
    """The records of a metrics.jsonl, in file order; ValueError naming the file and line if one is bad."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not a JSON line ({e})") from None
            missing = [k for k in ("epoch", "train_loss", "valid_loss", "bleu", "tokens_per_s") if k not in record]
            if missing:
                raise ValueError(f"{path}:{number}: record lacks {missing}")
            records.append(record)
    return records


def plot_metrics(metrics_path: Path, out_path: Optional[Path] = None) -> Path:
    """Write the PNG of a metrics.jsonl (default: metrics.png beside it); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    out_path = metrics_path.with_suffix(".png") if out_path is None else Path(out_path)
    records = read_records(metrics_path)
    if not records:
        raise ValueError(f"{metrics_path} holds no records to plot")
    epochs = [r["epoch"] for r in records]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    axes[0].plot(epochs, [r["train_loss"] for r in records], "o-", label="train")
    axes[0].plot(epochs, [r["valid_loss"] for r in records], "s-", label="validation")
    axes[0].set_ylabel("cross-entropy per target token")
    axes[0].set_title("loss")
    axes[0].legend()
    axes[1].plot(epochs, [r["bleu"] for r in records], "o-", color="tab:green")
    axes[1].set_ylabel("BLEU (sacrebleu, test)")
    axes[1].set_title("BLEU")
    axes[2].plot(epochs, [r["tokens_per_s"] for r in records], "o-", color="tab:purple")
    axes[2].set_ylabel("training tokens / s")
    axes[2].set_title("throughput")
    axes[2].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.set_xticks(epochs)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{metrics_path} ({len(records)} epochs)")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def main(argv: Optional[Sequence[str]] = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("metrics", type=Path, help="a run's metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="PNG to write (None: metrics.png beside the input)")
    args = parser.parse_args(argv)
    out = plot_metrics(args.metrics, args.out)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
