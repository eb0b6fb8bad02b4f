"""Flat gradient buckets and the rounds of backward passes that fill them: the gradient accumulation
of a step's micro-batches, and the layout that data parallelism reduces (DistributedDataParallel is
a GradientAccumulator whose reducing rounds also communicate).

Layout.  The parameters, in reverse order of `module.parameters()` (about the order in which
backward finishes them), fill flat float32 buckets: the first up to `FIRST_BUCKET_MB` (small, so
that communication starts early in backward), the others up to `bucket_cap_mb` (by default an
eighth of the model, between 1 and 25 MB, so that a small model still gets several buckets to
overlap with backward).  With `shards` > 1 every bucket is padded (zeros) to a multiple of
shards x SHARD_ALIGN floats and cut into `shards` equal shards: process r owns shard r of every
bucket (ZeRO).  One buffer per bucket on the parameters' backend; each parameter's gradient has a
slot in it.

Rounds.  A round is one backward pass.  Each parameter's gradient, as soon as backward finishes it
(a grad-ready hook, overlap=True) or when `sync_gradients()` is called (overlap=False), is scaled
by `gradient_weight` and written into its slot, or added to it when the round accumulates (a later
micro-batch of the step); on CUDA all members of a bucket go in one kernel (the backend's
gradient_pack), elsewhere a few ops each.  A parameter without a gradient counts as zeros.  Buckets
are completed in bucket order, as soon as all their members have arrived (where
DistributedDataParallel starts a bucket's collective).  A round that reduces (by default every
round: the last micro-batch of a step) ends with each parameter's .grad a view of its slot; one that
does not leaves .grad None, the sum staying in the buckets for the rounds after it.

How a round combines is said by `backward_round(accumulate, reduce)` around its backward, by a
caller that knows each micro-batch's place in the step (as a captured CUDA graph needs: its Python
does not run on replay, so no state may carry over from the previous round), or else follows
`no_sync()`: rounds inside it do not reduce, and a round accumulates when the buckets hold earlier
rounds' sums (PyTorch's way).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..module import Module, Parameter
from ..tensor import Tensor
from ..tensor_data import TensorData, prod
from ..tensor_ops import hook

FIRST_BUCKET_MB = 1.0
MAX_BUCKET_MB = 25.0
SHARD_ALIGN = 32  # floats: every shard starts on a 128-byte boundary (vector loads, NCCL chunks)


def default_bucket_cap_mb(n_floats: int) -> float:
    """An eighth of the model, between 1 and MAX_BUCKET_MB megabytes."""
    return min(MAX_BUCKET_MB, max(1.0, 4 * n_floats / 2**20 / 8))


@dataclass
class Bucket:
    """One flat buffer holding the gradients of some parameters (and, where the parameters are
    sharded, a second one of the same layout holding their values)."""

    members: List[int]  # parameter indices
    offsets: List[int]  # each member's first float in the buffer
    size: int  # floats, padded to whole shards
    storage: Any  # the backend's 1-D float32 storage
    comm: Any = None  # the same memory as a torch tensor (what torch.distributed reduces)
    values: Any = None  # sharded parameters: their storage, laid out as the gradients
    missing: int = 0  # members whose gradient this round has not produced yet
    work: Optional[Any] = None  # the collective in flight
    event: Optional[Any] = None  # CUDA: marks the end of the pack on the compute stream


@dataclass
class _Round:
    """What the backward pass in progress has done, and how it combines."""

    accumulate: bool  # add to the slots (a later micro-batch) instead of writing them
    reduce: bool  # the step's last round: reduce, then hand out the gradients
    ready: Dict[int, Optional[TensorData]] = field(default_factory=dict)  # index -> gradient (None: zeros)
    launched: int = 0  # buckets completed so far (always a prefix)


class GradientAccumulator:
    """Sum the gradients of several backward passes (the micro-batches of a step) into flat
    buckets, each pass's scaled by `gradient_weight` (default 1), so that a step whose batch does
    not fit one pass trains as one pass over all of it.  See the module docstring for the layout
    and the rounds.  A CUDA graph can capture and replay the rounds (their buffers stay put)."""

    def __init__(self, module: Module, bucket_cap_mb: Optional[float] = None, overlap: bool = True, shards: int = 1):
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self.module = module
        self.overlap = overlap
        self.shards = shards
        named = [(name, p) for name, p in module.named_parameters() if isinstance(p.value, Tensor)]
        if not named:
            raise ValueError(f"{type(self).__name__}: the module has no tensor parameters")
        self._names = [name for name, _ in named]
        self._params: List[Parameter] = [p for _, p in named]
        self._backend = self._params[0].value.backend
        self._cuda = bool(self._backend.ops.is_cuda)
        self._check_placement()
        self.gradient_weight = 1.0
        total = sum(p.value.numel() for p in self._params)
        cap = default_bucket_cap_mb(total) if bucket_cap_mb is None else bucket_cap_mb
        self._buckets: List[Bucket] = []
        self._slots: List[TensorData] = []
        self._grads: List[Tensor] = []
        self._build_buckets(int(cap * 2**20) // 4)
        self._round: Optional[_Round] = None
        self._next: Optional[Tuple[bool, bool]] = None
        self._pending = False  # the buckets hold sums of rounds not reduced yet
        self._local = False
        self._hooks: Dict[int, Any] = {}
        if overlap:
            for index, p in enumerate(self._params):
                self._hooks[index] = self._make_hook(index)
                p.register_grad_ready_hook(self._hooks[index])

    # ---- setup -------------------------------------------------------------------------------
    def _check_placement(self) -> None:
        kind = type(self).__name__
        for name, p in zip(self._names, self._params):
            if p.value.backend.ops is not self._backend.ops:
                raise ValueError(
                    f"{kind}: parameter {name} is on {p.value.backend.ops.__name__}, "
                    f"{self._names[0]} on {self._backend.ops.__name__}; put the model on one backend"
                )
            if not p.value.is_contiguous():
                raise ValueError(f"{kind}: parameter {name} (shape {p.value.shape}) is not contiguous")

    def _build_buckets(self, cap_floats: int) -> None:
        first_cap = min(cap_floats, int(FIRST_BUCKET_MB * 2**20) // 4)
        groups: List[List[int]] = [[]]
        filled = 0
        for index in reversed(range(len(self._params))):
            size = self._params[index].value.numel()
            if groups[-1] and filled + size > (first_cap if len(groups) == 1 else cap_floats):
                groups.append([])
                filled = 0
            groups[-1].append(index)
            filled += size
        self._slots = [None] * len(self._params)  # type: ignore[list-item]
        self._grads = [None] * len(self._params)  # type: ignore[list-item]
        self._bucket_of = {index: b for b, members in enumerate(groups) for index in members}
        unit = self.shards * SHARD_ALIGN if self.shards > 1 else 1
        for members in groups:
            offsets, offset = [], 0
            for index in members:
                offsets.append(offset)
                offset += self._params[index].value.numel()
            size = -(-offset // unit) * unit
            storage = self._zeros(size)
            self._buckets.append(Bucket(members, offsets, size, storage, missing=len(members)))
            for index, start in zip(members, offsets):
                view = self._view(storage, start, self._params[index].value.shape)
                self._slots[index] = view
                self._grads[index] = Tensor(view, backend=self._backend)

    def _zeros(self, size: int) -> Any:
        storage = self._backend.ops.storage_empty(size)
        self._backend.ops.fill(TensorData(storage, (size,)), 0.0)
        return storage

    @staticmethod
    def _view(storage: Any, start: int, shape: Tuple[int, ...]) -> TensorData:
        return TensorData(storage[start : start + prod(shape)], shape)

    def _make_hook(self, index: int) -> Any:
        def grad_ready(tensor: Tensor) -> None:
            self._on_grad_ready(index, tensor)

        return grad_ready

    # ---- the public controls -----------------------------------------------------------------
    @property
    def gradient_weight(self) -> float:
        """The factor of this process's gradients in the sums; set it before backward."""
        return self._gradient_weight

    @gradient_weight.setter
    def gradient_weight(self, value: float) -> None:
        value = float(value)
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"gradient_weight must be a finite number >= 0, got {value}")
        self._gradient_weight = value

    @property
    def parameters(self) -> List[Parameter]:
        """The parameters it combines the gradients of, in module.parameters() order."""
        return list(self._params)

    @property
    def bucket_sizes(self) -> List[int]:
        """Floats per bucket (padded to whole shards), in the order the buckets are completed."""
        return [b.size for b in self._buckets]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def backward_round(self, accumulate: bool, reduce: bool) -> Iterator[None]:
        """The backward pass inside is one round, ended (sync_gradients' work) when the block ends:
        its gradients are added to the sums of earlier rounds (accumulate) or written over them, and
        reduced and handed out at its end (reduce: the step's last micro-batch) or kept."""
        self._next = (bool(accumulate), bool(reduce))
        yield
        if self._round is not None or self._next is not None:
            self._end_round()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside add their gradients into the buckets without reducing them; the
        first reducing round after it (a backward outside, or sync_gradients()) reduces the sums."""
        previous, self._local = self._local, True
        try:
            yield
        finally:
            self._local = previous

    def sync_gradients(self) -> None:
        """End the round of the last backward now: take the gradients backward has not handed over
        (a parameter without a gradient counts as zeros), complete the buckets not completed yet
        and, in a reducing round, reduce and hand out the gradients.  With overlap=True after a
        complete backward it has nothing left to do; outside no_sync() it also reduces the sums
        that backward passes inside no_sync() left in the buckets."""
        if self._round is None and self.overlap and not self._pending:
            return
        self._end_round()

    def close(self) -> None:
        """Remove the hooks from the parameters (the accumulator no longer acts on backward)."""
        for index, fn in self._hooks.items():
            self._params[index].remove_grad_ready_hook(fn)
        self._hooks = {}

    # ---- one round: packs, completions, the end ----------------------------------------------
    def _end_round(self) -> None:
        state = self._round or self._start_round()
        for index in range(len(self._params)):
            if index not in state.ready:
                self._take(index, self._params[index].value.grad)
        self._complete_ready_buckets()
        self._finish()

    def _start_round(self) -> _Round:
        accumulate, reduce = self._next if self._next is not None else (self._pending, not self._local)
        self._next = None
        self._round = _Round(accumulate, reduce)
        return self._round

    def _on_grad_ready(self, index: int, tensor: Tensor) -> None:
        state = self._round or self._start_round()
        if index in state.ready:
            missing = [self._names[i] for i in range(len(self._params)) if i not in state.ready]
            raise RuntimeError(
                f"{type(self).__name__}: {self._names[index]} got a second gradient before the previous one "
                f"was reduced; the last backward gave no gradient to {missing}. Call sync_gradients() after "
                f"each backward when some parameters may get none, or accumulate inside no_sync()"
            )
        self._take(index, tensor.grad)
        self._complete_ready_buckets()
        if state.launched == len(self._buckets):
            self._finish()

    def _take(self, index: int, grad: Optional[Tensor]) -> None:
        """Note this round's gradient of parameter `index` (None: zeros) for its bucket's pack; in a
        round that keeps its sum in the buckets, .grad is dropped so a next backward does not add
        it again."""
        slot = self._slots[index]
        if grad is not None and grad.shape != slot.shape:
            raise ValueError(f"gradient of {self._names[index]} has shape {grad.shape}, the parameter {slot.shape}")
        self._round.ready[index] = None if grad is None else grad._tensor
        if not self._round.reduce:
            self._params[index].value.grad = None
        self._buckets[self._bucket_of[index]].missing -= 1

    def _pack(self, bucket: Bucket) -> None:
        """Each member's gradient x gradient_weight into its slot, or added to it (nothing for a
        member without a gradient when adding; zeros when writing)."""
        ops, accumulate = self._backend.ops, self._round.accumulate
        slots, grads = [], []
        for index in bucket.members:
            grad = self._round.ready[index]
            if grad is not None:
                slots.append(self._slots[index])
                grads.append(grad)
            elif not accumulate:
                ops.fill(self._slots[index], 0.0)
        pack = hook(ops, "gradient_pack")
        if pack is not None and grads:
            pack(slots, grads, self._gradient_weight, accumulate)
            return
        backend = self._backend
        for slot, grad in zip(slots, grads):
            if accumulate:
                backend.id_map(backend.add_zip(slot, backend.mul_scalar(grad, self._gradient_weight)), out=slot)
            else:
                backend.mul_scalar(grad, self._gradient_weight, out=slot)

    def _complete_ready_buckets(self) -> None:
        state = self._round
        while state.launched < len(self._buckets) and self._buckets[state.launched].missing == 0:
            bucket = self._buckets[state.launched]
            self._pack(bucket)
            self._complete(bucket)
            state.launched += 1

    def _complete(self, bucket: Bucket) -> None:
        """A bucket of this round is packed (DistributedDataParallel starts its collective)."""

    def _finish(self) -> None:
        state = self._round
        self._wait()
        for bucket in self._buckets:
            bucket.missing = len(bucket.members)
        if state.reduce:
            self._hand_out()
        self._pending = not state.reduce
        self._round = None

    def _wait(self) -> None:
        """Wait for the round's collectives (none here)."""

    def _hand_out(self) -> None:
        """After a reducing round: each parameter's .grad is a view of its slot."""
        for p, grad in zip(self._params, self._grads):
            p.value.grad = grad
