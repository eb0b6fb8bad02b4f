"""One run per output directory.

A run holds an exclusive ``fcntl.flock`` on ``<out-dir>/.lock`` from before it reads or writes
anything there until it ends; the kernel releases the lock when the process ends in any way,
kill -9 included, so a crashed run never leaves the directory locked. The holder writes its PID
into the file, and a second run into the same directory fails at once, naming it:

    with locked_out_dir(out_dir):      # DirectoryInUse (an InputError) when another run holds it
        train()

Under torchrun the processes of one run share the directory: rank 0 holds the lock for them all
(`first_process()`).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from project.common.options import InputError

LOCK_NAME = ".lock"
PID_WAIT_S = 1.0  # how long a refused run waits for a holder that has just taken the lock to write its PID


class DirectoryInUse(InputError):
    """The output directory is locked by another run."""


def first_process() -> bool:
    """Whether this process is rank 0 of a torchrun launch, or not under torchrun at all."""
    return os.environ.get("RANK", "0") == "0"


def _holder(fd: int) -> str:
    """The PID written in a lock file held by another process ("unknown" if it wrote none in time)."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text or time.monotonic() > deadline:
            return text or "unknown"
        time.sleep(0.02)


@contextmanager
def locked_out_dir(out_dir: str | os.PathLike, option: str = "--out-dir", hold: bool = True) -> Iterator[Path]:
    """Create out_dir if needed and hold its lock for the block (hold=False: a process of a run
    whose rank 0 holds it; nothing is locked). Raises DirectoryInUse, naming option and the PID of
    the run that holds it. The file is left empty on release, so a PID in it always belongs to a
    live holder or to a run that was killed."""
    out_dir = Path(out_dir)
    if not hold:
        yield out_dir / LOCK_NAME
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryInUse(
                f"{option} {out_dir} is in use by another run (PID {_holder(fd)}); wait for it to end, stop it "
                f"(Ctrl-C or kill saves a checkpoint there) or choose another {option}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock
