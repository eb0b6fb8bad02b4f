"""minitorch.set_float32_matmul_precision: PyTorch's spelling, "highest" by default, rejects unknown
values clearly, and changes nothing on the CPU backends (they compute in float32);
float32_matmul_precision sets it for a block and restores the previous value."""

from __future__ import annotations

import numpy as np
import pytest
from minitorch_testing import mt

import minitorch


def test_precision_api_and_cpu_results(backend) -> None:
    assert minitorch.get_float32_matmul_precision() == "highest"
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    highest = (mt(a, backend) @ mt(b, backend)).to_numpy()
    with minitorch.float32_matmul_precision("high"):
        assert minitorch.get_float32_matmul_precision() == "high"
        high = (mt(a, backend) @ mt(b, backend)).to_numpy()
    assert minitorch.get_float32_matmul_precision() == "highest"
    np.testing.assert_array_equal(high, highest)


def test_precision_context_restores_the_previous_value_on_errors() -> None:
    try:
        minitorch.set_float32_matmul_precision("high")
        with pytest.raises(RuntimeError, match="inside"):
            with minitorch.float32_matmul_precision("highest"):
                assert minitorch.get_float32_matmul_precision() == "highest"
                raise RuntimeError("inside")
        assert minitorch.get_float32_matmul_precision() == "high"
    finally:
        minitorch.set_float32_matmul_precision("highest")


@pytest.mark.parametrize("bad", ["medium", "HIGH", "", None])
def test_unknown_precision_is_refused(bad) -> None:
    with pytest.raises(ValueError, match=r"float32 matmul precision must be one of \('highest', 'high'\)"):
        minitorch.set_float32_matmul_precision(bad)
    assert minitorch.get_float32_matmul_precision() == "highest"
