"""The bf16 matmul binding (minitorch/cuda/matmul_bf16.py) without a GPU: its library is registered, its
C ABI matches the source, bad arguments are refused before any device work, and the library (where
compile_cuda.sh built it) exports its symbols."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from minitorch.cuda import matmul_bf16, runtime
from minitorch.cuda.libraries import LIBRARIES

SOURCE = Path(__file__).resolve().parents[1] / "src" / "matmul_bf16_kernel.cu"


def test_registered_with_the_other_libraries() -> None:
    assert LIBRARIES["matmul_bf16_kernel"] is matmul_bf16.SIGNATURES


@pytest.mark.parametrize("symbol", sorted(matmul_bf16.SIGNATURES))
def test_signatures_match_the_source(symbol: str) -> None:
    """Each extern "C" function of the source takes as many arguments as its ctypes declaration."""
    found = re.search(rf"\b{symbol}\(([^)]*)\)\s*{{", SOURCE.read_text())
    assert found, f"{SOURCE.name} defines no {symbol}"
    assert len(found.group(1).split(",")) == len(matmul_bf16.SIGNATURES[symbol][1])


@pytest.mark.parametrize(
    "kwargs, message",
    [({"out_dtype": "float16"}, "out_dtype"), ({"activation": "tanh"}, "activation"),
     ({"activation": "bias"}, "activation"), ({"accumulate": True, "activation": "gelu"}, "accumulate"),
     ({"addend": 1}, "addend is read by accumulate")],
)  # fmt: skip
def test_bad_arguments_are_refused_before_launch(kwargs: dict, message: str) -> None:
    args = {"out_dtype": "bfloat16", **kwargs}
    out_dtype = args.pop("out_dtype")
    with pytest.raises(ValueError, match=message):
        matmul_bf16.launch(0, out_dtype, 8, 0, 0, 8, 8, 8, (8, 1, 8, 1), **args)


@pytest.mark.skipif(
    not runtime.library_path("matmul_bf16_kernel").exists(), reason="matmul_bf16_kernel.so not built (bash compile_cuda.sh)"
)
def test_built_library_exports_its_abi() -> None:
    raw = ctypes.CDLL(str(runtime.library_path("matmul_bf16_kernel")))
    for symbol in ["minitorch_error_string", *matmul_bf16.SIGNATURES]:
        assert hasattr(raw, symbol), f"matmul_bf16_kernel.so does not export {symbol}"
