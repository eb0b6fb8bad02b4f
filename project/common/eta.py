"""How long a training run takes: an estimate before it starts, from a calibrated speed per backend,
then refined from the steps it has measured; and the first line of a run, which announces it.

A step's time is modelled as a fixed host cost plus its model FLOPs (6 x parameters x tokens for a
training step, 2 x for a forward pass, llm.c's count) at a sustained rate; decoding one token for
many rows costs a fraction of a step's host cost plus its FLOPs. The constants were fitted to
measured runs: "cpu" to the translation program on a shared 2-core machine (FastOps: 0.42 s per step
of the tiny preset, 10.0 s per step of the default model, 27 s of numba compilation and tokenizer
training before the first step, 70 ms per greedy decoding step of 100 sentences), "cuda" to one H100
(6.2 ms per step of the default translation model, 42.9 ms per step of GPT-2 124M at B 4 x T 1024,
0.6 ms per decoding step). Another machine differs: the estimate is refined as steps are timed.

    plan = Estimate(startup_s=speed.startup_s, step_s=speed.train_step(params, tokens), steps=800, other_s=30)
    pace = Pace()
    ...; pace.step()                                  # after every step
    plan.remaining(steps_left, other_left_s, pace.seconds_per_step)
    first_line(choice, "new run in runs/mt", "tiny", True, 232_168, "80 steps", plan.total_s)
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Deque, Optional

import numpy as np

import minitorch

SLOW_ON_A_CPU_S = 1800.0  # a full preset planned longer than this on a CPU gets the hint to --preset tiny
DECODE_SHARE = 0.18  # a one-token decoding step's host cost, as a share of a training step's


@dataclass(frozen=True)
class Speed:
    """A backend's calibrated speed: model FLOPs per second, host seconds per step, seconds before
    the first step (imports, the CUDA context, numba's compilation of the CPU kernels)."""

    flops_per_s: float
    step_overhead_s: float
    startup_s: float

    def train_step(self, params: int, tokens: int) -> float:
        """Seconds of one training step (forward, backward, optimizer) over `tokens` tokens."""
        return self.step_overhead_s + 6.0 * params * tokens / self.flops_per_s

    def forward(self, params: int, tokens: int) -> float:
        """Seconds of one forward pass (evaluation) over `tokens` tokens."""
        return self.step_overhead_s / 3.0 + 2.0 * params * tokens / self.flops_per_s

    def decode_step(self, params: int, rows: int) -> float:
        """Seconds of one decoding step that adds a token to each of `rows` sequences."""
        return self.step_overhead_s * DECODE_SHARE + 2.0 * params * rows / self.flops_per_s


SPEEDS = {"cuda": Speed(8.0e13, 4.0e-3, 10.0), "cpu": Speed(2.0e10, 0.38, 30.0)}


def speed_of(backend: minitorch.TensorBackend) -> Speed:
    """The calibrated speed of a backend (its kind: CUDA or a CPU one)."""
    return SPEEDS["cuda" if backend.cuda else "cpu"]


def format_duration(seconds: float) -> str:
    """A duration as people say it: "40 s", "7 min", "2 h 05 min"."""
    if seconds < 90:
        return f"{max(seconds, 1.0):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass(frozen=True)
class Estimate:
    """A run's planned time: startup, `steps` training steps of step_s each, and other work
    (evaluation, samples, saving) of other_s seconds in all."""

    startup_s: float
    step_s: float
    steps: int
    other_s: float

    @property
    def total_s(self) -> float:
        return self.startup_s + self.steps * self.step_s + self.other_s

    def remaining(self, steps_left: int, other_left_s: float, seconds_per_step: Optional[float] = None) -> float:
        """Seconds still to go with steps_left steps and other_left_s seconds of planned other work;
        with a measured seconds_per_step, the steps take that long and the other work is scaled by
        how far the measurement is from the plan."""
        scale = 1.0 if seconds_per_step is None else seconds_per_step / self.step_s
        return (steps_left * self.step_s + other_left_s) * scale


class Pace:
    """Measured seconds per training step of this process: the median of its last WINDOW steps that
    ran back to back, so the compilation or graph capture of early steps and a moment of load on
    the machine fade out; time between steps (evaluation) is left out through pause()."""

    WINDOW = 25

    def __init__(self) -> None:
        self._last: Optional[float] = None
        self._recent: Deque[float] = deque(maxlen=self.WINDOW)

    def step(self) -> None:
        """A step has ended (on CUDA it may still run: over many steps the host keeps the GPU's pace)."""
        now = time.perf_counter()
        if self._last is not None:
            self._recent.append(now - self._last)
        self._last = now

    def pause(self) -> None:
        """The next step does not follow this one directly (an evaluation comes between)."""
        self._last = None

    @property
    def seconds_per_step(self) -> Optional[float]:
        """Median seconds per step of the recent steps (None until two steps ran back to back)."""
        return float(np.median(self._recent)) if self._recent else None


def first_line(
    choice: minitorch.BackendChoice, start: str, preset: str, auto_preset: bool, params: int, steps: str,
    seconds: Optional[float] = None, resumed: bool = False,
) -> str:  # fmt: skip
    """A run's first line: the backend and why, `start` (new run or resuming, and where), the
    preset (and whether "auto" chose it), the model's parameters, `steps` (the program's words)
    and the estimated seconds of the whole run (of what is left, when resumed)."""
    line = f"{choice}; {start}: preset {preset}{' (auto)' if auto_preset else ''}, {params:,} parameters, {steps}"
    if seconds is None:
        return line
    line += f", estimated {format_duration(seconds)} {'to go' if resumed else 'in all'}"
    if preset == "full" and not choice.backend.cuda and seconds > SLOW_ON_A_CPU_S:
        line += " (--preset tiny: minutes)"
    return line
