"""minitorch.choose_backend / cuda_unavailable_reason / peak_memory_mb on the CPU: what "auto",
"cuda" and "cpu" pick and say, here (no GPU) and with CUDA made to look available or its kernels
missing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import minitorch
from minitorch import backends
from minitorch.cuda import libraries, runtime


def test_cpu_is_the_numba_backend() -> None:
    choice = minitorch.choose_backend("cpu")
    assert choice == minitorch.BackendChoice(minitorch.TensorBackend(minitorch.FastOps), "cpu", "requested: numba FastOps")
    assert str(choice) == "backend cpu (requested: numba FastOps)"
    with pytest.raises(AttributeError):
        choice.name = "cuda"  # frozen


def test_auto_and_cuda_where_cuda_cannot_run() -> None:
    reason = minitorch.cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA runs here; kernel_tests/ cover it")
    choice = minitorch.choose_backend()
    assert choice.name == "cpu" and choice.backend.ops is minitorch.FastOps
    assert choice.reason == f"auto: CUDA unavailable: {reason}"
    with pytest.raises(ValueError) as error:
        minitorch.choose_backend("cuda")
    message = str(error.value)
    assert reason in message and "bash compile_cuda.sh" in message
    assert "--backend cpu" in message and "--backend auto" in message


def test_auto_and_cuda_where_cuda_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "cuda_unavailable_reason", lambda: None)
    for name, reason in (("auto", "auto: a CUDA GPU and the built kernels are present"), ("cuda", "requested")):
        choice = minitorch.choose_backend(name)
        assert (choice.name, choice.reason) == ("cuda", reason)
        assert choice.backend.ops is minitorch.CudaKernelOps and choice.backend.cuda


def test_missing_kernels_are_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(backends, "unavailable_reason", lambda: None)  # as if a GPU were there
    monkeypatch.setattr(libraries, "runtime", lambda: SimpleNamespace(lib=runtime.load_library))
    monkeypatch.setattr(runtime, "KERNEL_DIR", tmp_path)
    reason = minitorch.cuda_unavailable_reason()
    assert reason is not None and "combine.so is missing" in reason and "bash compile_cuda.sh" in reason


def test_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown backend 'gpu': expected one of 'auto', 'cuda', 'cpu'"):
        minitorch.choose_backend("gpu")


def test_peak_memory_on_the_cpu_is_the_resident_size() -> None:
    reading = minitorch.peak_memory_mb(minitorch.choose_backend("cpu").backend)
    assert reading["memory_kind"] == "host_rss" and reading["peak_memory_mb"] > 1.0
