"""GPU tests of the CUDA backend.  Every test here is skipped, with the reason, when the backend
cannot run (no CUDA GPU visible to torch, or kernels not built with `bash compile_cuda.sh`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import List, Optional

import pytest

HERE = Path(__file__).resolve().parent


def _unavailable() -> Optional[str]:
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the CUDA backend takes device memory and streams from it)"
    from minitorch import cuda_kernel_ops

    return cuda_kernel_ops.unavailable_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    reason = _unavailable()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=f"CUDA backend unavailable: {reason}")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:  # this hook sees the whole session's items
            item.add_marker(marker)


def pytest_report_header(config: pytest.Config) -> str:
    reason = _unavailable()
    if reason is not None:
        return f"minitorch CUDA backend: unavailable ({reason})"
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no torch CUDA device"
    return f"minitorch CUDA backend: loaded on {device} (torch {torch.__version__})"
