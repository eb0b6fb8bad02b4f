"""Joining a data-parallel run: torch.distributed's process group from torchrun's environment.

`torchrun --nproc_per_node N program.py` starts N copies of a program and tells each its place
through environment variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
`init_process_group` reads them and joins the group: NCCL when the tensors live on CUDA GPUs (one
GPU per process, picked by LOCAL_RANK and made the current device before any CUDA tensor exists),
gloo on the CPU backends.  The helpers below answer "who am I" and move a few host numbers or
objects between the processes; they also work, as the identity, in a plain single process.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, List, Mapping, Optional, Sequence

from .liveness import active_watchdog, stop_watchdog

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
DEVICES = {"cuda": "nccl", "cpu": "gloo"}
# How long a collective may wait for the other processes before the job fails (NCCL's own default
# is 30 minutes).  Waits on another process's long work go through the store (barrier()) instead.
DEFAULT_TIMEOUT = timedelta(seconds=120)


class DistributedSetupError(RuntimeError):
    """The environment, the device or torch cannot make the process group asked for."""


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the group."""

    rank: int
    world_size: int
    local_rank: int
    device: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files, prints and evaluates."""
        return self.rank == 0


def launched_by_torchrun(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether any of torchrun's variables is set (a plain `python program.py` sets none)."""
    environ = os.environ if environ is None else environ
    return any(name in environ for name in TORCHRUN_VARIABLES)


def _torch_distributed() -> Any:
    try:
        import torch.distributed as dist
    except ImportError as e:
        raise DistributedSetupError("data-parallel training needs PyTorch (torch.distributed)") from e
    if not dist.is_available():
        raise DistributedSetupError("this PyTorch build has no torch.distributed support")
    return dist


def _environment(environ: Mapping[str, str]) -> tuple:
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
    if missing:
        raise DistributedSetupError(
            f"the environment lacks {', '.join(missing)}: start the program with "
            f"`torchrun --nproc_per_node N ...` (or set all of {', '.join(TORCHRUN_VARIABLES)})"
        )
    numbers = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        try:
            numbers[name] = int(environ[name])
        except ValueError:
            raise DistributedSetupError(f"{name}={environ[name]!r} is not an integer") from None
    rank, world_size, local_rank = numbers["RANK"], numbers["WORLD_SIZE"], numbers["LOCAL_RANK"]
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise DistributedSetupError(
            f"need WORLD_SIZE >= 1, 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0; got RANK={rank}, "
            f"WORLD_SIZE={world_size}, LOCAL_RANK={local_rank}"
        )
    return rank, world_size, local_rank


def _select_gpu(local_rank: int) -> None:
    """Make GPU LOCAL_RANK current, before any minitorch CUDA storage is allocated on another."""
    import torch

    if not torch.cuda.is_available():
        raise DistributedSetupError(
            "device 'cuda' (NCCL) needs a CUDA GPU, and torch.cuda.is_available() is False here; "
            "use device 'cpu' (gloo)"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise DistributedSetupError(
            f"LOCAL_RANK={local_rank} but this machine shows {count} CUDA GPU(s): start at most "
            f"{count} processes per node (torchrun --nproc_per_node {count})"
        )
    from ..cuda.runtime import is_loaded

    if is_loaded() and torch.cuda.current_device() != local_rank:
        raise DistributedSetupError(
            f"CUDA tensors already exist on GPU {torch.cuda.current_device()}: call init_process_group "
            f"before making any CUDA tensor, so this process (LOCAL_RANK={local_rank}) uses GPU {local_rank}"
        )
    torch.cuda.set_device(local_rank)


def init_process_group(device: str, timeout: timedelta = DEFAULT_TIMEOUT) -> ProcessInfo:
    """Join the process group torchrun's environment describes; device "cuda" (NCCL, one GPU per
    process: GPU LOCAL_RANK becomes current) or "cpu" (gloo).  Call it once, before making tensors.
    A collective that waits longer than `timeout` fails the job; on NCCL the process is torn down
    then (TORCH_NCCL_ASYNC_ERROR_HANDLING=3 unless set) rather than left hanging."""
    if device not in DEVICES:
        raise DistributedSetupError(f"device {device!r}: expected one of {sorted(DEVICES)}")
    rank, world_size, local_rank = _environment(os.environ)
    dist = _torch_distributed()
    if dist.is_initialized():
        raise DistributedSetupError("the process group is already initialized; call destroy_process_group first")
    if device == "cuda":
        _select_gpu(local_rank)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    backend = DEVICES[device]
    if not (dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available()):
        raise DistributedSetupError(f"this PyTorch build lacks the {backend} backend that device {device!r} needs")
    # env:// reaches the store torchrun's agent serves at MASTER_ADDR:MASTER_PORT.
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
    return ProcessInfo(rank, world_size, local_rank, device, backend)


def init_from_torchrun(device: str, timeout: timedelta = DEFAULT_TIMEOUT) -> ProcessInfo:
    """What a training program calls first: join the group (init_process_group) when torchrun
    started it, else go on as rank 0 of 1 with no group.  The program then reads its shard of the
    data with info.rank / info.world_size, wraps its model in DistributedDataParallel when
    info.world_size > 1, writes files and prints on info.is_main only, and ends with
    destroy_process_group()."""
    if launched_by_torchrun():
        return init_process_group(device, timeout)
    if device not in DEVICES:
        raise DistributedSetupError(f"device {device!r}: expected one of {sorted(DEVICES)}")
    return ProcessInfo(0, 1, 0, device, "none")


def is_initialized() -> bool:
    """Whether this process has joined a process group."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_initialized()


def process_info() -> ProcessInfo:
    """The group this process joined, or rank 0 of 1 on the CPU when it joined none."""
    if not is_initialized():
        return ProcessInfo(0, 1, 0, "cpu", "none")
    import torch.distributed as dist

    backend = dist.get_backend()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return ProcessInfo(dist.get_rank(), dist.get_world_size(), local_rank, "cuda" if backend == "nccl" else "cpu", backend)


def get_rank() -> int:
    """This process's rank (0 without a group)."""
    return process_info().rank


def get_world_size() -> int:
    """Processes in the group (1 without a group)."""
    return process_info().world_size


def is_main_process() -> bool:
    """Rank 0 (also true without a group)."""
    return get_rank() == 0


def _host_device() -> Any:
    """Where tensors for collectives on host values live: the current GPU for NCCL, else the CPU."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if process_info().backend == "nccl" else torch.device("cpu")


def barrier(name: str = "barrier") -> None:
    """Wait until every process gets here (nothing without a group).  With the watchdog running
    (liveness.py) the wait goes through the store, with no time limit (a lost process still ends
    it): for waits on another process's long work; `name` tells such barriers apart."""
    watchdog = active_watchdog()
    if watchdog is not None:
        watchdog.wait_for_all(name)
    elif is_initialized():
        import torch.distributed as dist

        if process_info().backend == "nccl":
            dist.barrier(device_ids=[_host_device().index])
        else:
            dist.barrier()


def all_reduce_sum(values: Sequence[float]) -> List[float]:
    """Each value summed over the processes, in float64 (the values themselves without a group)."""
    if not is_initialized():
        return [float(v) for v in values]
    import torch
    import torch.distributed as dist

    buffer = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_host_device())
    dist.all_reduce(buffer)
    return buffer.cpu().tolist()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank src's obj (picklable) on every process."""
    if not is_initialized():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_host_device())
    return box[0]


def reduce_scatter_into(shard: Any, full: Any, async_op: bool = True) -> Any:
    """shard <- this process's part of the sum over the processes of `full` (torch tensors; shard may
    be the view of full at rank x shard size: in place); the work when async_op."""
    import torch.distributed as dist

    op = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # the name before torch 2.13
    return op(shard, full, async_op=async_op)


def all_gather_into(full: Any, shard: Any, async_op: bool = True) -> Any:
    """full <- every process's `shard` in rank order (torch tensors; shard may be the view of full at
    rank x shard size: in place); the work when async_op."""
    import torch.distributed as dist

    op = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the name before torch 2.13
    return op(full, shard, async_op=async_op)


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. trains and saves a tokenizer), the others after it is done
    (and load what it saved)."""
    if not is_main_process():
        barrier("main_process_first")
    yield
    if is_main_process():
        barrier("main_process_first")


def destroy_process_group() -> None:
    """Leave the group after every process got here (a store barrier without a time limit where the
    watchdog runs, which then stops), so no process exits while another still communicates."""
    if is_initialized():
        import torch.distributed as dist

        barrier("destroy_process_group")
        stop_watchdog()
        barrier()
        dist.destroy_process_group()
