"""notebooks/quickstart.ipynb executes headless without errors (nbclient, a fresh kernel), and
project/translation/plot.py turns a run's metrics.jsonl into a PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from project.common.metrics import read_records
from project.translation.plot import main as plot_main
from project.translation.plot import plot_metrics

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
PNG = b"\x89PNG\r\n\x1a\n"


def test_quickstart_notebook_executes() -> None:
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -r requirements.txt)")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -r requirements.txt)")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "training accuracy" in text and "same predictions after load: True" in text
    assert "CUDA part skipped:" in text or "fused softmax on cuda" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "the notebook shows a plot"


def write_metrics(path: Path, epochs: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for e in range(1, epochs + 1):
            f.write(json.dumps({"epoch": e, "train_loss": 5.0 / e, "valid_loss": 4.0 / e, "bleu": 10.0 * e,
                                "tokens_per_s": 1000.0 + e}) + "\n")  # fmt: skip


def test_plot_metrics_writes_a_png(tmp_path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    write_metrics(metrics, 3)
    assert [r["epoch"] for r in read_records(metrics)] == [1, 2, 3]
    assert plot_metrics(metrics) == tmp_path / "metrics.png"
    assert (tmp_path / "metrics.png").read_bytes()[:8] == PNG
    out = plot_main([str(metrics), "--out", str(tmp_path / "other.png")])
    assert out.read_bytes()[:8] == PNG


def test_plot_metrics_errors_name_the_file_and_line(tmp_path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"epoch": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: record lacks \['train_loss'"):
        plot_metrics(metrics)
    metrics.write_text("not json\n")
    with pytest.raises(ValueError, match="metrics.jsonl:1: not a JSON line"):
        plot_metrics(metrics)
    metrics.write_text("")
    with pytest.raises(ValueError, match="holds no records to plot"):
        plot_metrics(metrics)
