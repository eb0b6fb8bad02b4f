"""A lost process never hangs the others: heartbeats through the rendezvous store, and waits without
a time limit that the heartbeats guard.

`start_watchdog(timeout_s)` starts a thread in this process that, every `interval_s` seconds, adds
one to this rank's counter in the store at MASTER_ADDR:MASTER_PORT (the TCPStore that torchrun's
agent, or rank 0 when no agent serves one, runs for the group) and reads the other ranks' counters.
A rank whose counter has not moved for `timeout_s` seconds (killed, crashed, its host gone), or a
store that stops answering, ends this process at once: one line on stderr naming the lost rank(s)
and the caller's hint (how to resume), then exit status LOST_PEER_EXIT.  It has to be the thread
that ends the process: the main thread may sit inside a collective that waits for the dead peer.
A rank that leaves normally (stop_watchdog) marks itself done first, so the others do not count it
as lost.  Counters, not clocks, go through the store, so the nodes' clocks need not agree.

`wait_for_all(name)` is a barrier over the store with no time limit, for where processes wait on
another's long work (rank 0 evaluating or writing a checkpoint) and a collective's timeout would be
wrong; a lost peer still ends it, through the watchdog.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

LOST_PEER_EXIT = 75  # EX_TEMPFAIL: the job can go on from its last checkpoint
POLL_S = 0.05  # how often wait_for_all looks at the store


class Watchdog:
    """The heartbeat thread and the store barrier of one process (see the module docstring)."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, interval_s: float = 1.0, hint: str = ""):
        if not timeout_s > interval_s > 0:
            raise ValueError(f"need timeout_s > interval_s > 0, got timeout_s={timeout_s}, interval_s={interval_s}")
        self.rank, self.world_size = rank, world_size
        self.timeout_s, self.interval_s, self.hint = timeout_s, interval_s, hint
        self.address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        self._store_owner = "torchrun's agent on the first node" if agent else "rank 0"
        self._prefix = f"minitorch/liveness/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._beats = self._connect()  # the thread's connection
        self._waits = self._connect()  # the main thread's
        self._generation: Dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="minitorch-watchdog", daemon=True)
        self._thread.start()

    def _connect(self) -> Any:
        import torch.distributed as dist

        host, port = self.address
        return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=self.timeout_s),
                             wait_for_workers=False)  # fmt: skip

    def _key(self, *parts: Any) -> str:
        return "/".join([self._prefix, *map(str, parts)])

    def _run(self) -> None:
        store, peers = self._beats, [r for r in range(self.world_size) if r != self.rank]
        start = time.monotonic()
        seen: Dict[int, Tuple[int, float]] = {r: (-1, start) for r in peers}
        done: set = set()
        while True:
            try:
                store.add(self._key("beat", self.rank), 1)
                now, lost = time.monotonic(), []
                for r in peers:
                    if r in done:
                        continue
                    count = store.add(self._key("beat", r), 0)
                    if count != seen[r][0]:
                        seen[r] = (count, now)
                    elif now - seen[r][1] > self.timeout_s:
                        if store.check([self._key("done", r)]):
                            done.add(r)
                        else:
                            lost.append((r, now - seen[r][1]))
            except Exception as err:  # the store's own errors differ between torch versions
                if not self._stop.is_set():
                    self._store_lost(err)
                return
            if lost:
                self._exit(_lost_message(lost, self.world_size))
                return
            if self._stop.wait(self.interval_s):
                return

    def _store_lost(self, err: Exception) -> None:
        host, port = self.address
        first = str(err).splitlines()[0] if str(err) else ""
        self._exit(f"lost {self._store_owner}: the rendezvous store it serves at {host}:{port} stopped answering "
                   f"({type(err).__name__}: {first})")  # fmt: skip

    def _exit(self, what: str) -> None:
        hint = f" {self.hint}" if self.hint else ""
        print(f"error: {what}; rank {self.rank} exits (status {LOST_PEER_EXIT}).{hint}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(LOST_PEER_EXIT)

    def wait_for_all(self, name: str) -> None:
        """Return once every rank has called wait_for_all(name) as often as this one."""
        generation = self._generation[name] = self._generation.get(name, 0) + 1
        key = self._key("barrier", name, generation)
        try:
            arrived = self._waits.add(key, 1)
            while arrived < self.world_size:
                time.sleep(POLL_S)
                arrived = self._waits.add(key, 0)
        except Exception as err:  # as in _run: the process that serves the store is gone
            self._store_lost(err)

    def stop(self) -> None:
        """Mark this rank done (the others no longer watch it) and end the thread."""
        self._waits.set(self._key("done", self.rank), "1")
        self._stop.set()
        self._thread.join()


def _lost_message(lost: List[Tuple[int, float]], world_size: int) -> str:
    names = ", ".join(f"rank {r}" for r, _ in lost)
    silent = max(seconds for _, seconds in lost)
    return (f"lost {names} of {world_size}: no heartbeat for {silent:.0f} s (the process exited or was killed, or "
            f"its host is unreachable)")  # fmt: skip


_active: Optional[Watchdog] = None


def start_watchdog(timeout_s: float, hint: str = "", interval_s: Optional[float] = None) -> Watchdog:
    """Start this process's watchdog (once, after init_process_group); hint ends the message of a
    lost peer (e.g. how to resume from the last checkpoint); a heartbeat every interval_s seconds
    (default: every second, or 4 per timeout when it is shorter)."""
    global _active
    from .process_group import process_info

    if _active is not None:
        raise RuntimeError("the watchdog is already running; stop_watchdog() first")
    info = process_info()
    if info.backend == "none":
        raise RuntimeError("start_watchdog needs a process group: call init_process_group first")
    interval = min(1.0, timeout_s / 4) if interval_s is None else interval_s
    _active = Watchdog(info.rank, info.world_size, timeout_s, interval, hint)
    return _active


def active_watchdog() -> Optional[Watchdog]:
    """The running watchdog, or None."""
    return _active


def stop_watchdog() -> None:
    """Stop the running watchdog, if any (see Watchdog.stop)."""
    global _active
    if _active is not None:
        _active.stop()
        _active = None
