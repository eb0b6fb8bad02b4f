"""pytest setup of the CPU tests: the hypothesis profiles, the backend fixture, the record of what
backward's ops fold (taken_pending) and the translation program's corpus and two-epoch reference run
(shared by its test modules).

MINITORCH_HYPOTHESIS_PROFILE=minitorch-thorough runs 20x more examples per property (minutes, not
for CI).  Both backends are built once per session (TensorBackend caches them), so numba compiles
each FastOps kernel a single time for the whole run.
"""

import os

import pytest
from hypothesis import HealthCheck, settings
from minitorch_testing import BACKENDS

import minitorch
from mt_program import TINY, write_corpus

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


@pytest.fixture
def taken_pending(monkeypatch):
    """The list of what Context.take_pending hands backward's ops in this test, in order (None where
    nothing of the asked dtype was gathered)."""
    taken = []
    take = minitorch.autodiff.Context.take_pending

    def spy(ctx: minitorch.Context, i: int, dtype: minitorch.DType) -> object:
        taken.append(take(ctx, i, dtype))
        return taken[-1]

    monkeypatch.setattr(minitorch.autodiff.Context, "take_pending", spy)
    return taken


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """A small Multi30k-like corpus (tests/mt_program.py)."""
    directory = tmp_path_factory.mktemp("corpus")
    write_corpus(directory)
    return directory


@pytest.fixture(scope="session")
def straight_run(corpus_dir, tmp_path_factory):
    """The tiny translation model trained two epochs in one go (main()'s result)."""
    from project.translation import main as run_mt

    out = tmp_path_factory.mktemp("straight")
    return run_mt.main(TINY + ["--epochs", "2", "--data-dir", str(corpus_dir), "--out-dir", str(out)])
