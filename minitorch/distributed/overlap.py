"""How much of the gradient communication backward hides: per reducing round of
DistributedDataParallel(profile=True), when each bucket's collective ran and when backward ended.

A round's communication time is the union of its collectives' intervals (from the moment a
collective could start, its bucket packed and the previous one done, to its end); its exposed time
runs from the end of backward (the last gradient handed over, on the compute stream) to the end of
the last collective, the part of the communication the step waits for.  The hidden share is
1 - exposed / communication.  On CUDA the marks are timing events on the streams (a profiled round
cannot be captured in a CUDA graph: run it eagerly); on the CPU, host clocks at launch and at
completion (gloo's futures).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


@dataclass
class _Marks:
    collectives: List[List[Any]] = field(default_factory=list)  # [start, end] per bucket
    backward_end: Any = None


class OverlapProfile:
    """The marks of every profiled round and their summary (see the module docstring)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self._rounds: List[_Marks] = []

    def begin_round(self) -> None:
        self._rounds.append(_Marks())

    def collective_started(self) -> List[Any]:
        """Mark a collective's start (on CUDA: on the current, communication, stream); returns the
        record whose end `collective_ended` fills."""
        record = [self._now(), None]
        self._rounds[-1].collectives.append(record)
        return record

    def collective_ended(self, record: List[Any], work: Any) -> None:
        """Mark the end of the collective `work` (CUDA: on the communication stream, after it waited
        for the work; CPU: when gloo completes it)."""
        if self.cuda:
            record[1] = self._now()
        else:
            work.get_future().add_done_callback(lambda _: record.__setitem__(1, time.perf_counter()))

    def backward_ended(self) -> None:
        """Mark the end of backward (on CUDA: on the compute stream)."""
        self._rounds[-1].backward_end = self._now()

    def rounds(self) -> List[Tuple[float, float]]:
        """(communication seconds, exposed seconds) per profiled round (waits for the device)."""
        out = []
        for marks in self._rounds:
            if not marks.collectives or marks.backward_end is None or any(e is None for _, e in marks.collectives):
                continue  # not a reducing round, or gloo has not run a completion callback yet
            spans = sorted((self._seconds(s), self._seconds(e)) for s, e in marks.collectives)
            busy, reach = 0.0, float("-inf")
            for start, end in spans:
                busy += max(0.0, end - max(start, reach))
                reach = max(reach, end)
            out.append((busy, max(0.0, reach - self._seconds(marks.backward_end))))
        return out

    def summary(self, skip: int = 0) -> Dict[str, Optional[float]]:
        """Medians over the rounds after the first `skip`: communication and exposed milliseconds,
        and the hidden share 1 - exposed / communication (None without rounds)."""
        kept = self.rounds()[skip:]
        if not kept:
            return {"rounds": 0, "comm_ms": None, "exposed_ms": None, "hidden_share": None}
        comm = statistics.median(c for c, _ in kept)
        exposed = statistics.median(e for _, e in kept)
        return {"rounds": len(kept), "comm_ms": 1e3 * comm, "exposed_ms": 1e3 * exposed,
                "hidden_share": 1.0 - exposed / comm if comm > 0 else None}  # fmt: skip

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("DistributedDataParallel(profile=True) cannot run inside a CUDA graph capture: profile eagerly")
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, mark: Any) -> float:
        """A mark as seconds on one clock (CUDA: since the first round's first mark)."""
        if not self.cuda:
            return mark
        origin = self._rounds[0].collectives[0][0]
        mark.synchronize()
        return origin.elapsed_time(mark) / 1e3
