"""The CUDA build, checked without a GPU: libraries built by compile_cuda.sh load and export their
C ABI, `import minitorch` works anywhere, and the CUDA backend fails with a clear error (not a
crash) where it cannot run."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import minitorch
from minitorch import cuda_kernel_ops as cko
from minitorch.cuda import combine, integer, runtime
from minitorch.cuda.libraries import LIBRARIES, exported_symbols

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "src").glob("*.cu"))
BUILT = sorted(runtime.KERNEL_DIR.glob("*.so"))

needs_build = pytest.mark.skipif(
    not BUILT, reason=f"no libraries in {runtime.KERNEL_DIR}: run `bash compile_cuda.sh` first (CI does)"
)


@needs_build
def test_every_source_has_a_library() -> None:
    missing = [s.name for s in SOURCES if not runtime.library_path(s.stem).exists()]
    assert not missing, f"compile_cuda.sh left no library for {missing} in {runtime.KERNEL_DIR}"


def test_every_source_has_a_binding() -> None:
    unbound = [s.name for s in SOURCES if s.stem not in LIBRARIES]
    assert not unbound, f"no binding in minitorch/cuda/libraries.py for {unbound}"


@needs_build
@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_library_loads_and_exports_its_abi(name: str) -> None:
    raw = ctypes.CDLL(str(runtime.library_path(name)))
    missing = [s for s in exported_symbols(name) if not hasattr(raw, s)]
    assert not missing, f"{name}.so does not export {missing}"
    lib = runtime.load_library(name, LIBRARIES[name])
    assert lib.minitorch_error_string(0) == b"no error"
    assert lib.minitorch_error_string(1) == b"invalid argument"


@needs_build
def test_combine_opcode_tables_match_the_binding() -> None:
    lib = runtime.load_library("combine", combine.SIGNATURES)
    unary = [lib.minitorch_unary_op_name(i).decode() for i in range(lib.minitorch_unary_op_count())]
    binary = [lib.minitorch_binary_op_name(i).decode() for i in range(lib.minitorch_binary_op_count())]
    assert tuple(unary) == combine.UNARY_OPS, f"combine.so unary opcodes {unary} vs the binding's {combine.UNARY_OPS}"
    assert tuple(binary) == combine.BINARY_OPS, f"combine.so binary opcodes {binary} vs the binding's {combine.BINARY_OPS}"
    assert lib.minitorch_unary_op_name(len(unary)) is None
    for name in combine.UNARY_OPS + combine.BINARY_OPS:
        assert callable(getattr(minitorch.operators, name)), f"operators.{name} is missing"


@needs_build
def test_int_kernel_opcode_tables_match_the_binding() -> None:
    lib = runtime.load_library("int_kernel", integer.SIGNATURES)
    unary = [lib.minitorch_int_unary_op_name(i).decode() for i in range(lib.minitorch_int_unary_op_count())]
    binary = [lib.minitorch_int_binary_op_name(i).decode() for i in range(lib.minitorch_int_binary_op_count())]
    assert tuple(unary) == integer.UNARY_OPS and tuple(binary) == integer.BINARY_OPS, (unary, binary)
    assert lib.minitorch_int_max_sort_row() == integer.MAX_SORT_ROW
    for name in integer.UNARY_OPS + integer.BINARY_OPS:
        assert getattr(minitorch.operators, name) in minitorch.operators.INTEGER_OPS, f"operators.{name} is not an integer op"


def test_import_minitorch_works_in_a_fresh_interpreter() -> None:
    code = "import minitorch; assert minitorch.CudaKernelOps.is_cuda; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, f"import minitorch failed:\n{result.stderr}"


def test_missing_kernels_give_an_error_naming_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runtime, "KERNEL_DIR", tmp_path)
    with pytest.raises(RuntimeError, match="compile_cuda.sh"):
        runtime.load_library("combine", combine.SIGNATURES)


def test_cuda_backend_without_a_gpu_raises_a_clear_error() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; kernel_tests/ covers the backend there")
    backend = minitorch.TensorBackend(minitorch.CudaKernelOps)
    with pytest.raises(RuntimeError, match="CUDA GPU|compile_cuda.sh") as info:
        minitorch.tensor([1.0, 2.0], backend=backend)
    assert cko.unavailable_reason() == str(info.value)
    with pytest.raises(RuntimeError, match="CUDA GPU|compile_cuda.sh"):
        minitorch.zeros((2, 2), backend=backend)


def test_compile_script_rejects_a_bad_architecture() -> None:
    env = dict(os.environ, MINITORCH_CUDA_ARCH="not-an-arch")
    result = subprocess.run(
        ["bash", str(ROOT / "compile_cuda.sh")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0, "compile_cuda.sh accepted MINITORCH_CUDA_ARCH=not-an-arch"
    assert "error" in result.stderr, f"compile_cuda.sh failed without saying why:\n{result.stderr}"
