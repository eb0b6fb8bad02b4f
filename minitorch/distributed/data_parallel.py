"""DistributedDataParallel: every process trains the same model on its own share of a batch, and the
gradients are combined over the processes before the optimizer step, so all copies stay equal.

It is a GradientAccumulator (buckets.py: flat buckets, rounds of backward passes, micro-batches)
whose reducing rounds communicate: as soon as a bucket is complete its collective starts, in bucket
order (so every process issues the same collectives in the same order), while backward goes on.
On CUDA a collective waits for its bucket's pack through an event recorded on the compute stream
and runs on a communication stream; when the round ends, the compute stream waits for the
communication stream, so the optimizer reads reduced gradients.  With overlap=False the whole
round is a phase of its own in `sync_gradients()`, after backward (the benchmark's baseline).

Weights.  The reduced gradient is the sum over processes of `gradient_weight` x the process's
(accumulated) gradient.  The default 1 / world_size averages; a program whose processes see
different numbers of target tokens scales each process's loss by its share (its tokens / all
tokens) and sets gradient_weight 1, which gives exactly the gradient of the token-weighted loss of
the whole, concatenated batch.

Two ways to reduce.  shard=False: each bucket is all-reduced and every parameter's .grad is a view
of its slot.  shard=True (ZeRO stage 1, with ShardedAdamW): each bucket is reduce-scattered, so
process r holds the reduced sum of shard r of every bucket only (`shard_views`), and no .grad is
handed out; the parameters themselves move into flat buffers laid out like the gradient buckets, so
that after the optimizer updated each process's shard, `gather_parameters()` all-gathers every
bucket of values in place.

profile=True records when each collective ran and when backward ended (overlap.py, eager rounds
only): `overlap_summary()` says how much of the communication backward hid.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Tuple

from ..dtypes import float32
from ..module import Module
from ..tensor import Tensor
from ..tensor_data import TensorData
from .buckets import Bucket, GradientAccumulator
from .overlap import OverlapProfile
from .process_group import (
    DistributedSetupError,
    all_gather_into,
    broadcast_object,
    is_initialized,
    process_info,
    reduce_scatter_into,
)


class DistributedDataParallel(GradientAccumulator):
    """Keep `module`'s parameters equal across the processes of the group by combining gradients.

    Construction broadcasts rank 0's parameter values to every process (after checking that all
    processes hold the same parameter names and shapes).  Calling the wrapper calls the module.
    See the module docstrings (here and buckets.py) for buckets, rounds, weights and the modes.
    Gradient accumulation over several backward passes: `backward_round(accumulate, reduce)`
    around each, or all but the last inside `no_sync()`.
    """

    def __init__(
        self, module: Module, bucket_cap_mb: Optional[float] = None, overlap: bool = True, shard: bool = False,
        profile: bool = False,
    ):  # fmt: skip
        if not is_initialized():
            raise DistributedSetupError(
                "DistributedDataParallel needs a process group: call minitorch.distributed.init_process_group first"
            )
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self._world_size, self._rank = dist.get_world_size(), dist.get_rank()
        super().__init__(module, bucket_cap_mb, overlap, shards=self._world_size if shard else 1)
        self.sharded = shard
        self._check_backend()
        self._check_same_model()
        self.gradient_weight = 1.0 / self._world_size
        for bucket in self._buckets:
            bucket.comm = self._as_torch(bucket.storage)
        if self._cuda:
            self._comm_stream = torch.cuda.Stream()
            for bucket in self._buckets:
                bucket.event = torch.cuda.Event()
        if shard:
            self._home_parameters()
        self._broadcast_parameters()
        self.profile: Optional[OverlapProfile] = OverlapProfile(self._cuda) if profile else None

    # ---- setup -------------------------------------------------------------------------------
    def _check_backend(self) -> None:
        need = "nccl" if self._cuda else "gloo"
        have = process_info().backend
        if have != need:
            raise DistributedSetupError(
                f"the parameters are on {self._backend.ops.__name__}, which needs the {need} backend, but the "
                f"process group uses {have}: init_process_group(device={'cuda' if self._cuda else 'cpu'!r})"
            )
        if self.sharded:
            for name, p in zip(self._names, self._params):
                if p.value.dtype is not float32:
                    raise ValueError(f"DistributedDataParallel(shard=True) keeps float32 weights; {name} is {p.value.dtype}")

    def _check_same_model(self) -> None:
        mine = [(name, tuple(p.value.shape)) for name, p in zip(self._names, self._params)]
        main = broadcast_object(mine)
        if main != mine:
            theirs, ours = next((a, b) for a, b in itertools.zip_longest(main, mine) if a != b)
            raise ValueError(
                f"DistributedDataParallel: this process's parameters differ from rank 0's "
                f"(first difference: rank 0 has {theirs}, this process {ours})"
            )

    def _as_torch(self, storage: Any) -> Any:
        return storage if self._cuda else self._torch.from_numpy(storage)

    def _home_parameters(self) -> None:
        """Move every parameter's values into a flat buffer per bucket, laid out as its gradients."""
        backend = self._backend
        for bucket in self._buckets:
            bucket.values = self._zeros(bucket.size)
            for index, start in zip(bucket.members, bucket.offsets):
                p = self._params[index]
                view = self._view(bucket.values, start, p.value.shape)
                backend.id_map(p.value._tensor, out=view)
                p.update(Tensor(view, backend=backend))

    def _broadcast_parameters(self) -> None:
        for p in self._params:
            self._dist.broadcast(p.value.to_torch(), src=0)

    # ---- ZeRO: shards ------------------------------------------------------------------------
    def shard_of(self, buffer: Any, bucket: int) -> Any:
        """This process's part of a buffer laid out as bucket `bucket` (numpy array, torch tensor or
        storage): a view."""
        per = self._buckets[bucket].size // self._world_size
        return buffer[self._rank * per : (self._rank + 1) * per]

    def shard_views(self) -> List[Tuple[Tensor, Tensor]]:
        """shard=True: (values, reduced gradient sum) of this process's shard of every bucket, as
        1-D tensors over the buffers (what ShardedAdamW updates)."""
        if not self.sharded:
            raise RuntimeError("shard_views() needs DistributedDataParallel(shard=True)")
        views = []
        for b, bucket in enumerate(self._buckets):
            values, grads = (self.shard_of(storage, b) for storage in (bucket.values, bucket.storage))
            views.append(tuple(Tensor(TensorData(s, (s.shape[0],)), backend=self._backend) for s in (values, grads)))
        return views  # type: ignore[return-value]

    def slot_ranges(self) -> List[List[Tuple[int, int, Tuple[int, ...]]]]:
        """Per bucket, (parameter index, first float, shape) of each member."""
        return [[(i, start, tuple(self._params[i].value.shape)) for i, start in zip(b.members, b.offsets)]
                for b in self._buckets]  # fmt: skip

    def gather_parameters(self) -> None:
        """shard=True, after each process updated its shards: every bucket of values all-gathered in
        place, so every process holds all parameters again."""
        works = []
        for b, bucket in enumerate(self._buckets):
            values = self._as_torch(bucket.values)
            works.append(self._collective(bucket, lambda _: all_gather_into(values, self.shard_of(values, b))))
        self._join(works)
        for p in self._params:
            p.value._version += 1  # written in place: autocast's cached copies of it are stale

    def gather_shard(self, shard: Tensor, bucket: int) -> Any:
        """The whole bucket-sized numpy array whose shards are every process's `shard` (a collective:
        every process calls it); what a checkpoint of sharded state gathers."""
        size = self._buckets[bucket].size
        full = self._backend.ops.storage_empty(size)
        all_gather_into(self._as_torch(full), shard.to_torch().reshape(-1), async_op=False)
        return self._backend.ops.storage_to_numpy(full)

    def all_reduce_sum_(self, values: Any) -> None:
        """Sum a torch tensor over the processes, in place (the optimizer's norm partials)."""
        self._dist.all_reduce(values)

    # ---- the collectives of a reducing round -------------------------------------------------
    def _complete(self, bucket: Bucket) -> None:
        if not self._round.reduce:
            return
        if self.profile is not None and self._round.launched == 0:
            self.profile.begin_round()
        if self.sharded:
            shard = self.shard_of(bucket.comm, self._round.launched)
            bucket.work = self._collective(bucket, lambda b: reduce_scatter_into(shard, b.comm))
        else:
            bucket.work = self._collective(bucket, lambda b: self._dist.all_reduce(b.comm, async_op=True))

    def _collective(self, bucket: Bucket, start: Any) -> Any:
        """Launch start(bucket) (an async collective) after the work queued so far on the compute
        stream: on CUDA on the communication stream."""
        profiled = self.profile is not None and self._round is not None
        if not self._cuda:
            record = self.profile.collective_started() if profiled else None
            work = start(bucket)
            if profiled:
                self.profile.collective_ended(record, work)
            return work
        cuda = self._torch.cuda
        bucket.event.record(cuda.current_stream())
        self._comm_stream.wait_event(bucket.event)
        with cuda.stream(self._comm_stream):
            record = self.profile.collective_started() if profiled else None
            work = start(bucket)
            if profiled:
                work.wait()  # the end mark, on this stream, then follows the collective
                self.profile.collective_ended(record, work)
        return work

    def _join(self, works: List[Any]) -> None:
        """The compute stream (or the host, on the CPU) waits for the works."""
        if self._cuda:
            cuda = self._torch.cuda
            compute = cuda.current_stream()
            with cuda.stream(self._comm_stream):
                for work in works:
                    work.wait()
            compute.wait_stream(self._comm_stream)
        else:
            for work in works:
                work.wait()

    def _wait(self) -> None:
        if not self._round.reduce:
            return
        if self.profile is not None:
            self.profile.backward_ended()
        self._join([b.work for b in self._buckets])
        for bucket in self._buckets:
            bucket.work = None

    def _hand_out(self) -> None:
        if not self.sharded:
            super()._hand_out()
            return
        for p in self._params:  # its local gradient: the reduced one is only this process's shard
            p.value.grad = None

    def overlap_summary(self, skip: int = 1) -> Dict[str, Optional[float]]:
        """profile=True: medians over the profiled rounds after the first `skip` (OverlapProfile.summary)."""
        if self.profile is None:
            raise RuntimeError("overlap_summary() needs DistributedDataParallel(profile=True)")
        return self.profile.summary(skip)
