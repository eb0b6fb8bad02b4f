"""Data-parallel training over several processes (several GPUs, or CPU processes) with
torch.distributed: NCCL between GPUs, gloo on the CPU backends, launched by torchrun.

    from minitorch import distributed
    info = distributed.init_from_torchrun("cuda")      # first: picks GPU LOCAL_RANK, joins NCCL
    model = DecoderLM(...)
    ddp = distributed.DistributedDataParallel(model) if info.world_size > 1 else None
    ... each process: its own batch (rank info.rank of info.world_size), loss.backward(),
    optimizer.step(); files, prints and evaluation on info.is_main ...
    distributed.destroy_process_group()

    torchrun --nproc_per_node 2 program.py ...

This package is not imported by `import minitorch` (it loads torch.distributed); import it where
a program trains in parallel.
"""

from .data_parallel import DistributedDataParallel
from .process_group import (
    TORCHRUN_VARIABLES,
    DistributedSetupError,
    ProcessInfo,
    all_reduce_sum,
    barrier,
    broadcast_object,
    destroy_process_group,
    get_rank,
    get_world_size,
    init_from_torchrun,
    init_process_group,
    is_initialized,
    is_main_process,
    launched_by_torchrun,
    main_process_first,
    process_info,
)

__all__ = [
    "DistributedDataParallel",
    "TORCHRUN_VARIABLES",
    "DistributedSetupError",
    "ProcessInfo",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "destroy_process_group",
    "get_rank",
    "get_world_size",
    "init_from_torchrun",
    "init_process_group",
    "is_initialized",
    "is_main_process",
    "launched_by_torchrun",
    "main_process_first",
    "process_info",
]
