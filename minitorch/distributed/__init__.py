"""Data-parallel training over several processes (several GPUs, or CPU processes) with
torch.distributed: NCCL between GPUs, gloo on the CPU backends, launched by torchrun (one node, or
several with c10d rendezvous).

    from minitorch import distributed
    info = distributed.init_from_torchrun("cuda")      # first: picks GPU LOCAL_RANK, joins NCCL
    distributed.start_watchdog(30.0)                   # a lost process ends the others, never hangs them
    model = DecoderLM(...)
    ddp = distributed.DistributedDataParallel(model)   # or (model, shard=True) + ShardedAdamW(ddp): ZeRO-1
    ... each process: its own share of the global batch; for micro-batches
    with ddp.backward_round(accumulate=i > 0, reduce=last): loss.backward()
    optimizer.step(); files, prints and evaluation on info.is_main ...
    distributed.destroy_process_group()

    torchrun --nproc_per_node 2 program.py ...

GradientAccumulator is the same gradient accumulation over micro-batches for one process.  This
package is not imported by `import minitorch` (it loads torch.distributed); import it where a program
trains in parallel.
"""

from .buckets import GradientAccumulator
from .data_parallel import DistributedDataParallel
from .liveness import LOST_PEER_EXIT, Watchdog, active_watchdog, start_watchdog, stop_watchdog
from .overlap import OverlapProfile
from .process_group import (
    DEFAULT_TIMEOUT,
    TORCHRUN_VARIABLES,
    DistributedSetupError,
    ProcessInfo,
    all_gather_into,
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
    reduce_scatter_into,
)
from .sharded_optimizer import ShardedAdamW

__all__ = [
    "DEFAULT_TIMEOUT",
    "DistributedDataParallel",
    "GradientAccumulator",
    "LOST_PEER_EXIT",
    "OverlapProfile",
    "ShardedAdamW",
    "TORCHRUN_VARIABLES",
    "DistributedSetupError",
    "ProcessInfo",
    "Watchdog",
    "active_watchdog",
    "all_gather_into",
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
    "reduce_scatter_into",
    "start_watchdog",
    "stop_watchdog",
]
