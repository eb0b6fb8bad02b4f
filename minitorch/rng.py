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
    """A fresh 63-bit seed for a backend's random kernels (the call's ordinal inside
    `seeds_from_device`)."""
    if _device_seed:
        return _next_ordinal()
    return int(_seed_rng[0].integers(0, 2**63 - 1))


_device_seed: list = []  # [TensorData of one int64 on the device, next call ordinal] while drawing from it


def device_seed() -> object:
    """The device seed buffer that CUDA random kernels read while `seeds_from_device` is active
    (None otherwise)."""
    return _device_seed[0] if _device_seed else None


class seeds_from_device:
    """Context in which CUDA random numbers (rand, dropout) take their key from a device buffer
    and next_seed() returns the ordinal of the call (0, 1, 2, ... from the context's start).

    The kernels read the key when they run, so a CUDA graph captured inside the context draws new
    numbers at each replay once the host has written a new key into the buffer, and an eager step
    inside the context draws exactly what a replay of it draws.  For CUDA tensors only (a CPU
    backend would see the ordinals as its seeds).
    """

    def __init__(self, seed_buffer: object):
        self.seed_buffer = seed_buffer

    def __enter__(self) -> "seeds_from_device":
        if _device_seed:
            raise RuntimeError("seeds_from_device contexts do not nest")
        _device_seed.extend([self.seed_buffer, 0])
        return self

    def __exit__(self, *exc: object) -> None:
        _device_seed.clear()


def _next_ordinal() -> int:
    ordinal = _device_seed[1]
    _device_seed[1] = ordinal + 1
    return ordinal
