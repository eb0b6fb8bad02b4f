"""DistributedDataParallel: every process trains the same model on its own share of a batch, and the
gradients are combined over the processes before the optimizer step, so all copies stay equal.

Buckets.  The parameters are laid out, in reverse order of `module.parameters()` (about the order
in which backward finishes them), in flat buckets of about `bucket_cap_mb` each; one buffer per
bucket on the parameters' backend (a numpy array on the CPU, a torch CUDA buffer on the GPU).  Once
backward has finished every gradient of a bucket, they are copied into their slots, scaled by this
process's `gradient_weight` (on CUDA in one kernel for the whole bucket, the backend's
gradient_pack; elsewhere one map_scalar with `out` each), and the bucket is all-reduced (sum) in
place; afterwards each parameter's `.grad` is a view of its slot.  The copy is what lets many
small gradients travel in one collective, and it keeps the reduction off the gradient tensors
themselves, whose storage backward may share with other tensors (an Add hands the same derivative
to both inputs).

Weights.  The reduced gradient is sum over processes of `gradient_weight * local gradient`.  The
default 1 / world_size averages; a program whose processes see different numbers of target tokens
sets each process's share (its tokens / all tokens) before backward, and the result is exactly the
gradient of the token-weighted loss of the whole, concatenated batch.

Two ways to run.  overlap=True: a grad-ready hook (Tensor.register_grad_ready_hook) notes each
gradient as soon as backward finishes it, and each bucket is packed and its all-reduce launched as
soon as the bucket is complete, in bucket order (so every process issues the same collectives in
the same order), while backward goes on.  On CUDA the all-reduce waits for the pack through an
event recorded on the compute stream and runs on a communication stream; when the last bucket is
launched, the compute stream waits for the communication stream, so the optimizer reads reduced
gradients.  overlap=False: backward runs untouched and `sync_gradients()`, called after it, packs
and all-reduces as a phase of its own (what a captured CUDA graph of backward, or any caller that
wants the phases apart, uses).  In both modes `sync_gradients()` after backward is safe: it
completes whatever backward did not (parameters that got no gradient count as zeros).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from ..module import Module, Parameter
from ..tensor import Tensor
from ..tensor_data import TensorData
from ..tensor_ops import hook
from .process_group import DistributedSetupError, broadcast_object, is_initialized, process_info


@dataclass
class _Bucket:
    """One flat buffer holding the gradients of some parameters."""

    storage: Any  # the backend's 1-D float32 storage
    comm: Any  # the same memory as a torch tensor (what torch.distributed reduces)
    members: List[int]  # parameter indices
    missing: int = 0  # members whose gradient this round has not produced yet
    work: Optional[Any] = None  # the all-reduce in flight
    event: Optional[Any] = None  # CUDA: marks the end of the pack on the compute stream


@dataclass
class _Slot:
    bucket: int
    view: TensorData  # this parameter's part of the bucket, in the parameter's shape
    grad: Tensor  # .grad after a synchronization (a tensor over `view`)


@dataclass
class _Round:
    """What the backward pass in progress has done."""

    ready: Dict[int, Optional[TensorData]] = field(default_factory=dict)  # index -> gradient (None: zeros)
    launched: int = 0  # buckets whose all-reduce has started (always a prefix)
    dirty: bool = False  # gradients accumulated under no_sync, not reduced yet


class DistributedDataParallel:
    """Keep `module`'s parameters equal across the processes of the group by combining gradients.

    Construction broadcasts rank 0's parameter values to every process (after checking that all
    processes hold the same parameter names and shapes).  Calling the wrapper calls the module.
    See the module docstring for buckets, weights and the two modes.  Gradient accumulation over
    several backward passes: run all but the last inside `no_sync()`.
    """

    def __init__(self, module: Module, bucket_cap_mb: float = 25.0, overlap: bool = True):
        if not is_initialized():
            raise DistributedSetupError(
                "DistributedDataParallel needs a process group: call minitorch.distributed.init_process_group first"
            )
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.module = module
        self.overlap = overlap
        named = [(name, p) for name, p in module.named_parameters() if isinstance(p.value, Tensor)]
        if not named:
            raise ValueError("DistributedDataParallel: the module has no tensor parameters")
        self._names = [name for name, _ in named]
        self._params: List[Parameter] = [p for _, p in named]
        self._backend = self._params[0].value.backend
        self._check_placement()
        self._check_same_model()
        self._world_size = dist.get_world_size()
        self.gradient_weight = 1.0 / self._world_size
        self._buckets: List[_Bucket] = []
        self._slots: List[_Slot] = []
        self._build_buckets(int(bucket_cap_mb * 2**20) // 4)
        self._round = _Round()
        self._local = False
        if self._cuda:
            self._comm_stream = torch.cuda.Stream()
            for bucket in self._buckets:
                bucket.event = torch.cuda.Event()
        self._broadcast_parameters()
        self._hooks: Dict[int, Any] = {}
        if overlap:
            for index, p in enumerate(self._params):
                self._hooks[index] = self._make_hook(index)
                p.register_grad_ready_hook(self._hooks[index])

    # ---- setup -------------------------------------------------------------------------------
    def _check_placement(self) -> None:
        for name, p in zip(self._names, self._params):
            if p.value.backend.ops is not self._backend.ops:
                raise ValueError(
                    f"DistributedDataParallel: parameter {name} is on {p.value.backend.ops.__name__}, "
                    f"{self._names[0]} on {self._backend.ops.__name__}; put the model on one backend"
                )
            if not p.value.is_contiguous():
                raise ValueError(f"DistributedDataParallel: parameter {name} (shape {p.value.shape}) is not contiguous")
        self._cuda = bool(self._backend.ops.is_cuda)
        need = "nccl" if self._cuda else "gloo"
        have = process_info().backend
        if have != need:
            raise DistributedSetupError(
                f"the parameters are on {self._backend.ops.__name__}, which needs the {need} backend, but the "
                f"process group uses {have}: init_process_group(device={'cuda' if self._cuda else 'cpu'!r})"
            )

    def _check_same_model(self) -> None:
        mine = [(name, tuple(p.value.shape)) for name, p in zip(self._names, self._params)]
        main = broadcast_object(mine)
        if main != mine:
            theirs, ours = next((a, b) for a, b in itertools.zip_longest(main, mine) if a != b)
            raise ValueError(
                f"DistributedDataParallel: this process's parameters differ from rank 0's "
                f"(first difference: rank 0 has {theirs}, this process {ours})"
            )

    def _build_buckets(self, cap_floats: int) -> None:
        groups: List[List[int]] = [[]]
        filled = 0
        for index in reversed(range(len(self._params))):
            size = self._params[index].value.numel()
            if groups[-1] and filled + size > cap_floats:
                groups.append([])
                filled = 0
            groups[-1].append(index)
            filled += size
        self._slots = [None] * len(self._params)  # type: ignore[list-item]
        for b, members in enumerate(groups):
            total = sum(self._params[i].value.numel() for i in members)
            storage = self._backend.ops.storage_empty(total)
            comm = storage if self._cuda else self._torch.from_numpy(storage)
            self._buckets.append(_Bucket(storage, comm, members, missing=len(members)))
            offset = 0
            for index in members:
                value = self._params[index].value
                view = TensorData(storage[offset : offset + value.numel()], value.shape)
                self._slots[index] = _Slot(b, view, Tensor(view, backend=self._backend))
                offset += value.numel()

    def _broadcast_parameters(self) -> None:
        for p in self._params:
            self._dist.broadcast(p.value.to_torch(), src=0)

    def _make_hook(self, index: int) -> Any:
        def grad_ready(tensor: Tensor) -> None:
            self._on_grad_ready(index, tensor)

        return grad_ready

    # ---- the public controls -----------------------------------------------------------------
    @property
    def gradient_weight(self) -> float:
        """This process's factor in the reduced gradient (default 1 / world_size); set it before
        backward."""
        return self._gradient_weight

    @gradient_weight.setter
    def gradient_weight(self, value: float) -> None:
        value = float(value)
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"gradient_weight must be a finite number >= 0, got {value}")
        self._gradient_weight = value

    @property
    def bucket_sizes(self) -> List[int]:
        """Floats per bucket, in the order the buckets are reduced."""
        return [sum(self._params[i].value.numel() for i in b.members) for b in self._buckets]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally, without communication; the first
        synchronized backward (or sync_gradients()) after it reduces the accumulated sums."""
        previous, self._local = self._local, True
        try:
            yield
        finally:
            self._local = previous

    def sync_gradients(self) -> None:
        """Make every parameter's .grad the reduced gradient now: take the gradients backward has not
        handed over (a parameter without a gradient counts as zeros), pack and all-reduce the buckets
        not yet launched, and wait.  With overlap=True after a complete backward it has nothing left
        to do."""
        state = self._round
        if self.overlap and not state.ready and not state.dirty:
            return
        for index in range(len(self._params)):
            if index not in state.ready:
                self._take(index, self._params[index].value.grad)
        self._launch_full_buckets()
        self._finish()

    def close(self) -> None:
        """Remove the hooks from the parameters (the wrapper no longer acts on backward)."""
        for index, hook in self._hooks.items():
            self._params[index].remove_grad_ready_hook(hook)
        self._hooks = {}

    # ---- one round: copies, launches, the wait -----------------------------------------------
    def _on_grad_ready(self, index: int, tensor: Tensor) -> None:
        if self._local:
            self._round.dirty = True
            return
        if index in self._round.ready:
            missing = [self._names[i] for i in range(len(self._params)) if i not in self._round.ready]
            raise RuntimeError(
                f"DistributedDataParallel: {self._names[index]} got a second gradient before the previous one "
                f"was reduced; the last backward gave no gradient to {missing}. Call sync_gradients() after "
                f"each backward when some parameters may get none, or accumulate inside no_sync()"
            )
        self._take(index, tensor.grad)
        self._launch_full_buckets()
        if self._round.launched == len(self._buckets):
            self._finish()

    def _take(self, index: int, grad: Optional[Tensor]) -> None:
        """Note this round's gradient of parameter `index` (None: zeros) for its bucket's pack."""
        slot = self._slots[index]
        if grad is not None and grad.shape != slot.view.shape:
            raise ValueError(f"gradient of {self._names[index]} has shape {grad.shape}, the parameter {slot.view.shape}")
        self._round.ready[index] = None if grad is None else grad._tensor
        self._buckets[slot.bucket].missing -= 1

    def _pack(self, bucket: _Bucket) -> None:
        """Each member's gradient x gradient_weight into its slot (zeros where it has none)."""
        ops = self._backend.ops
        slots, grads = [], []
        for index in bucket.members:
            grad = self._round.ready[index]
            if grad is None:
                ops.fill(self._slots[index].view, 0.0)
            else:
                slots.append(self._slots[index].view)
                grads.append(grad)
        pack = hook(ops, "gradient_pack")
        if pack is not None and grads:
            pack(slots, grads, self._gradient_weight)
        else:
            for slot, grad in zip(slots, grads):
                self._backend.mul_scalar(grad, self._gradient_weight, out=slot)

    def _launch_full_buckets(self) -> None:
        state = self._round
        while state.launched < len(self._buckets) and self._buckets[state.launched].missing == 0:
            self._launch(self._buckets[state.launched])
            state.launched += 1

    def _launch(self, bucket: _Bucket) -> None:
        self._pack(bucket)
        if not self._cuda:
            bucket.work = self._dist.all_reduce(bucket.comm, async_op=True)
            return
        cuda = self._torch.cuda
        bucket.event.record(cuda.current_stream())
        self._comm_stream.wait_event(bucket.event)
        with cuda.stream(self._comm_stream):
            bucket.work = self._dist.all_reduce(bucket.comm, async_op=True)

    def _finish(self) -> None:
        if self._cuda:
            cuda = self._torch.cuda
            compute = cuda.current_stream()
            with cuda.stream(self._comm_stream):
                for bucket in self._buckets:
                    bucket.work.wait()
            compute.wait_stream(self._comm_stream)
        else:
            for bucket in self._buckets:
                bucket.work.wait()
        for bucket in self._buckets:
            bucket.work = None
            bucket.missing = len(bucket.members)
        for p, slot in zip(self._params, self._slots):
            p.value.grad = slot.grad
        self._round = _Round()
