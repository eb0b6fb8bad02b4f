"""pytest setup of the CPU tests: the hypothesis profiles and the backend fixture.

MINITORCH_HYPOTHESIS_PROFILE=minitorch-thorough runs 20x more examples per property (minutes, not
for CI).  Both backends are built once per session (TensorBackend caches them), so numba compiles
each FastOps kernel a single time for the whole run.
"""

import os

import pytest
from hypothesis import HealthCheck, settings
from minitorch_testing import BACKENDS

# No deadline: the first example of a test may include numba compiling a kernel.
settings.register_profile(
    "minitorch-ci",
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("minitorch-thorough", settings.get_profile("minitorch-ci"), max_examples=500)
settings.load_profile(os.environ.get("MINITORCH_HYPOTHESIS_PROFILE", "minitorch-ci"))


@pytest.fixture(scope="session", params=list(BACKENDS), ids=list(BACKENDS))
def backend(request):
    """Each CPU backend in turn: SimpleOps (pure Python) and FastOps (numba)."""
    return BACKENDS[request.param]
