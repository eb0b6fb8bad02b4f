"""When a training run saves and stops: a step/minute checkpoint schedule and a graceful stop on
SIGINT/SIGTERM, for any training program.

    schedule = SaveSchedule(every_steps=500, every_minutes=10)
    with GracefulStop() as stop:
        for batch in batches:
            train_step(batch)
            step += 1
            if stop.requested or schedule.due(step):
                save(...)
                schedule.saved()
                if stop.requested:
                    break
        with stop.interruptible():        # evaluation: a signal ends it at once (StopRequested)
            evaluate()
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Dict, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequested(Exception):
    """A stop signal arrived inside GracefulStop.interruptible()."""


class SaveSchedule:
    """Checkpoint every `every_steps` steps and every `every_minutes` minutes (0 turns either off)."""

    def __init__(self, every_steps: int = 0, every_minutes: float = 0.0, clock: Callable[[], float] = time.monotonic):
        if every_steps < 0 or every_minutes < 0:
            raise ValueError(f"save intervals must be >= 0, got {every_steps} steps and {every_minutes} minutes")
        self.every_steps = every_steps
        self.every_seconds = 60.0 * every_minutes
        self.clock = clock
        self.last_save = clock()

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after `step` steps."""
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        by_time = self.every_seconds > 0 and self.clock() - self.last_save >= self.every_seconds
        return by_steps or by_time

    def saved(self) -> None:
        """A checkpoint was just written: the minute interval restarts."""
        self.last_save = self.clock()


class GracefulStop:
    """Context manager turning SIGINT/SIGTERM into a stop request.

    The first signal sets `requested` (the signal's name); the training loop finishes its step,
    saves and stops. Inside `interruptible()` it raises StopRequested at once instead, for work
    that changes no training state (evaluation). A second signal raises KeyboardInterrupt: stop
    now, without saving. Outside the main thread (where handlers cannot be set) it does nothing."""

    def __init__(self, out: Any = None):
        self.out = out if out is not None else sys.stderr
        self.requested: Optional[str] = None
        self._immediate = False
        self._previous: Dict[int, Any] = {}

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            raise KeyboardInterrupt(f"second {name}: stopping without saving")
        self.requested = name
        if self._immediate:
            raise StopRequested(name)
        print(f"\n{name} received: stopping after this step and saving (again to quit without saving)",
              file=self.out, flush=True)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A block that a stop signal ends at once with StopRequested (also when one is pending)."""
        if self.requested is not None:
            raise StopRequested(self.requested)
        self._immediate = True
        try:
            yield
        finally:
            self._immediate = False
