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

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "src").glob("*.cu"))
BUILT = sorted(cko.KERNEL_DIR.glob("*.so"))
EXPECTED_SYMBOLS = {
    "combine": cko.COMBINE_SYMBOLS,
    "softmax_kernel": cko.SOFTMAX_SYMBOLS,
    "layernorm_kernel": cko.LAYERNORM_SYMBOLS,
    "attention_kernel": cko.ATTENTION_SYMBOLS,
    "classifier_kernel": cko.CLASSIFIER_SYMBOLS,
    "optimizer_kernel": cko.OPTIMIZER_SYMBOLS,
}

needs_build = pytest.mark.skipif(
    not BUILT, reason=f"no libraries in {cko.KERNEL_DIR}: run `bash compile_cuda.sh` first (CI does)"
)


@needs_build
def test_every_source_has_a_library() -> None:
    missing = [s.name for s in SOURCES if not cko.library_path(s.stem).exists()]
    assert not missing, f"compile_cuda.sh left no library for {missing} in {cko.KERNEL_DIR}"


@needs_build
@pytest.mark.parametrize("name", sorted(EXPECTED_SYMBOLS))
def test_library_loads_and_exports_its_abi(name: str) -> None:
    if not (ROOT / "src" / f"{name}.cu").exists():
        pytest.skip(f"src/{name}.cu is not part of this checkout")
    raw = ctypes.CDLL(str(cko.library_path(name)))
    missing = [s for s in EXPECTED_SYMBOLS[name] if not hasattr(raw, s)]
    assert not missing, f"{name}.so does not export {missing}"
    lib = cko.load_library(name)
    assert lib.minitorch_error_string(0) == b"no error"
    assert lib.minitorch_error_string(1) == b"invalid argument"


@needs_build
def test_combine_opcode_tables_match_the_binding() -> None:
    lib = cko.load_library("combine")
    unary = [lib.minitorch_unary_op_name(i).decode() for i in range(lib.minitorch_unary_op_count())]
    binary = [lib.minitorch_binary_op_name(i).decode() for i in range(lib.minitorch_binary_op_count())]
    assert tuple(unary) == cko.UNARY_OPS, f"combine.so unary opcodes {unary} vs cuda_kernel_ops {cko.UNARY_OPS}"
    assert tuple(binary) == cko.BINARY_OPS, f"combine.so binary opcodes {binary} vs cuda_kernel_ops {cko.BINARY_OPS}"
    assert lib.minitorch_unary_op_name(len(unary)) is None
    for name in cko.UNARY_OPS + cko.BINARY_OPS:
        assert callable(getattr(minitorch.operators, name)), f"operators.{name} is missing"


def test_import_minitorch_works_in_a_fresh_interpreter() -> None:
    code = "import minitorch; assert minitorch.CudaKernelOps.is_cuda; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, f"import minitorch failed:\n{result.stderr}"


def test_missing_kernels_give_an_error_naming_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cko, "KERNEL_DIR", tmp_path)
    with pytest.raises(RuntimeError, match="compile_cuda.sh"):
        cko.load_library("combine")


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
