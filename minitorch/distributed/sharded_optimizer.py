"""ShardedAdamW: AdamW whose state is split over the processes (ZeRO stage 1).

With DistributedDataParallel(shard=True) the gradients of every bucket are reduce-scattered, so
process r holds the reduced gradient of shard r of every bucket (about 1/N of the model), and the
parameters live in flat buffers laid out like the gradients.  ShardedAdamW keeps AdamW's moments for
those shards only (2 x 1/N of the model per process instead of 2 x all of it) and each step updates
this process's shard of the float32 weights in place (on CUDA the multi-tensor AdamW kernels over
the shards, one tensor per bucket), then all-gathers the weights.  The gradient norm and its clip
are global: the partial sums of squares are summed over the processes before the norm is made.
Padding at the end of a bucket stays zero (zero weight, zero gradient, zero moments).

Checkpoints do not depend on the number of processes: state_dict() (a collective: every process
calls it) gathers the moments and returns them per parameter, exactly as AdamW.state_dict() does,
and load_state_dict() takes this process's shard of such a state, whatever the number of
processes (or the optimizer, sharded or not) that saved it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..autocast import refresh_working_copies
from ..module import Parameter
from ..optim import AdamW
from ..tensor_create import tensor_from_numpy
from .data_parallel import DistributedDataParallel


class ShardedAdamW(AdamW):
    """AdamW over this process's shards of `ddp`'s parameters (see the module docstring); its
    `parameters` are the model's, so step counts, learning rate, `grad_norm()`, state_dict and
    load_state_dict read as AdamW's."""

    def __init__(
        self, ddp: DistributedDataParallel, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999,
        eps: float = 1e-8, weight_decay: float = 1e-2, max_grad_norm: Optional[float] = None,
    ):  # fmt: skip
        if not getattr(ddp, "sharded", False):
            raise ValueError("ShardedAdamW needs DistributedDataParallel(module, shard=True)")
        super().__init__(ddp.parameters, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                         max_grad_norm=max_grad_norm)  # fmt: skip
        self.ddp = ddp
        self._shards: List[Parameter] = []
        for values, grads in ddp.shard_views():
            shard = Parameter(values)
            shard.value.grad = grads
            self._shards.append(shard)
        self._sumsq_reduce = ddp.all_reduce_sum_

    def _params_with_grad(self) -> List[Tuple[int, Parameter]]:
        return list(enumerate(self._shards))

    def update(self) -> None:
        """This process's shards updated, then every weight all-gathered, then the weights' autocast
        working copies rewritten from them.  The shards have no working copies for the update to
        write, and a copy left stale until the next forward reads it would be cast wherever that read
        happens to be: under CUDA graphs, in whichever captured body saw it stale at capture time (with
        micro-batches the last one, so that every later step's first micro-batch read the weights of
        the step before).  Here the casts belong to the update, in the graph that captures it."""
        super().update()
        self.ddp.gather_parameters()
        refresh_working_copies(p.value for p in self.parameters)

    @property
    def state_floats(self) -> int:
        """Floats of AdamW state this process holds (both moments of its shards)."""
        return 2 * sum(shard.value.numel() for shard in self._shards)

    def state_dict(self) -> Dict[str, Any]:
        """Step count and moments per parameter, as AdamW's (gathered: every process calls it)."""
        m: Dict[int, np.ndarray] = {}
        v: Dict[int, np.ndarray] = {}
        if self.m:
            for b, members in enumerate(self.ddp.slot_ranges()):
                for moments, out in ((self.m, m), (self.v, v)):
                    full = self.ddp.gather_shard(moments[b], b)
                    for index, start, shape in members:
                        out[index] = full[start : start + int(np.prod(shape))].reshape(shape).copy()
        return {"t": self.t, "m": m, "v": v}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Take this process's shard of a state saved by AdamW or ShardedAdamW on any number of
        processes (parameters without saved moments start from zeros)."""
        self.t = int(state["t"])
        self.m, self.v = {}, {}
        saved = {name: {int(i): np.asarray(a, dtype=np.float32) for i, a in state[name].items()} for name in ("m", "v")}
        if not saved["m"]:
            return
        sizes = self.ddp.bucket_sizes
        for b, members in enumerate(self.ddp.slot_ranges()):
            for name, into in (("m", self.m), ("v", self.v)):
                full = np.zeros(sizes[b], dtype=np.float32)
                for index, start, shape in members:
                    if index in saved[name]:
                        full[start : start + int(np.prod(shape))] = saved[name][index].reshape(-1)
                shard = self.ddp.shard_of(full, b)
                into[b] = tensor_from_numpy(shard.copy(), backend=self._shards[b].value.backend)
