"""The generator behind rand() and dropout on every backend: seeded once, drawn as 63-bit seeds that
each backend's random kernel expands (numpy on the CPU, Philox on CUDA)."""

from __future__ import annotations

import numpy as np

_seed_rng = [np.random.default_rng()]


def manual_seed(seed: int) -> None:
    """Seed the generator behind rand() and dropout on every backend."""
    _seed_rng[0] = np.random.default_rng(seed)


def get_rng_state() -> dict:
    """State of the generator behind rand() and dropout (for exact resume)."""
    return _seed_rng[0].bit_generator.state


def set_rng_state(state: dict) -> None:
    """Restore a state from get_rng_state()."""
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    _seed_rng[0] = rng


def next_seed() -> int:
    """A fresh 63-bit seed for a backend's random kernels."""
    return int(_seed_rng[0].integers(0, 2**63 - 1))
