"""Optimizers: SGD (with momentum), Adam and AdamW (fused and in place on CUDA)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .autocast import current_working_copy, refresh_working_copies, working_copy, working_copy_written
from .autodiff import no_grad
from .dtypes import DType, bfloat16
from .fused.adamw import adamw_step
from .module import Parameter
from .tensor import Tensor
from .tensor_create import tensor_from_numpy
from .tensor_ops import hook


class Optimizer:
    """Holds the parameters; `zero_grad` clears their gradients."""

    def __init__(self, parameters: Sequence[Parameter]):
        self.parameters: List[Parameter] = list(parameters)

    def zero_grad(self) -> None:
        for p in self.parameters:
            if p.value is not None:
                p.value.grad = None

    def _params_with_grad(self) -> List[Tuple[int, Parameter]]:
        return [(i, p) for i, p in enumerate(self.parameters) if p.value is not None and p.value.grad is not None]


class SGD(Optimizer):
    """p <- p - lr * (g + momentum buffer)."""

    def __init__(self, parameters: Sequence[Parameter], lr: float = 1.0, momentum: float = 0.0):
        super().__init__(parameters)
        self.lr = lr
        self.momentum = momentum
        self.buffers: Dict[int, Any] = {}

    def step(self) -> None:
        with no_grad():
            for i, p in self._params_with_grad():
                g = p.value.grad
                if self.momentum:
                    buf = self.buffers.get(i)
                    # A fresh tensor either way: the gradient's storage may be reused by the next
                    # backward (DistributedDataParallel's buckets), the momentum buffer must not be.
                    g = g * 1.0 if buf is None else buf * self.momentum + g
                    self.buffers[i] = g
                p.update(p.value.detach() - g * self.lr)


class Adam(Optimizer):
    """Adam (Kingma and Ba) with bias-corrected first and second moments.

    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;
    p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)  [- lr * weight_decay * p, decoupled]
    """

    def __init__(
        self,
        parameters: Sequence[Parameter],
        lr: float = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"{type(self).__name__} betas must be in [0, 1), got beta1={beta1}, beta2={beta2}")
        if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
            raise ValueError(
                f"{type(self).__name__} needs lr, eps and weight_decay >= 0, got {lr}, {eps}, {weight_decay}"
            )
        super().__init__(parameters)
        self.lr = lr
        self.beta1 = beta1
        self.beta2 = beta2
        self.eps = eps
        self.weight_decay = weight_decay
        self.t = 0
        self.m: Dict[int, Any] = {}
        self.v: Dict[int, Any] = {}

    def step(self) -> None:
        self.t += 1
        c1 = 1.0 - self.beta1**self.t
        c2 = 1.0 - self.beta2**self.t
        with no_grad():
            for i, p in self._params_with_grad():
                g = p.value.grad
                m = g * (1.0 - self.beta1) if i not in self.m else self.m[i] * self.beta1 + g * (1.0 - self.beta1)
                g2 = g * g
                v = g2 * (1.0 - self.beta2) if i not in self.v else self.v[i] * self.beta2 + g2 * (1.0 - self.beta2)
                self.m[i], self.v[i] = m, v
                denom = (v * (1.0 / c2)) ** 0.5 + self.eps
                value = p.value.detach()
                if self.weight_decay:
                    value = value * (1.0 - self.lr * self.weight_decay)
                p.update(value - m * (self.lr / c1) / denom)

    def state_dict(self) -> Dict[str, Any]:
        """Step count and moments as numpy arrays (for checkpoints)."""
        return {
            "t": self.t,
            "m": {i: t.to_numpy() for i, t in self.m.items()},
            "v": {i: t.to_numpy() for i, t in self.v.items()},
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what state_dict saved, on the parameters' backends."""
        self.t = int(state["t"])
        self.m = {int(i): tensor_from_numpy(np.asarray(a), backend=self.parameters[int(i)].value.backend) for i, a in state["m"].items()}
        self.v = {int(i): tensor_from_numpy(np.asarray(a), backend=self.parameters[int(i)].value.backend) for i, a in state["v"].items()}


class AdamW(Adam):
    """AdamW (Loshchilov and Hutter), computed as torch.optim.AdamW:

    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;
    p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).

    max_grad_norm: when set, every gradient is first scaled by min(1, max_grad_norm / global L2 norm
    of all gradients) (global-norm clipping); `grad_norm()` gives that norm, before clipping, as a
    one-element tensor (no host read).

    Unlike Adam, it updates IN PLACE: each parameter keeps its tensor and storage, and its moments
    are allocated once (zeros, at its first step) and overwritten after that.  On a backend with
    the multi-tensor hook (CUDA) the whole step is three kernel launches for all parameters that
    read the learning rate and step count from device memory: `begin_step()` queues those values
    (host work only), `update()` launches the kernels, so `update()` can be captured in a CUDA graph
    and replayed every step.  `step()` is both.  Elsewhere the update is `minitorch.fused.adamw_step`
    per parameter (composed tensor ops on the CPU backends), after a composed clip.  Each update ends
    by making the updated parameters' autocast working copies current
    (minitorch.autocast.refresh_working_copies).
    state_dict / load_state_dict are Adam's (step count and moments).

    Working copies are autocast's (one mechanism): on CUDA the update writes every bfloat16 working
    copy of an updated parameter in its own kernel pass, from the new float32 values (no separate
    cast); the others are cast after it.  working_dtype=minitorch.bfloat16 makes every parameter's
    copy at construction, so `working_copy(p)` exists before any autocast op has read p; the
    model's low-precision products read the same buffer, the parameter stays the float32 master that
    gradients accumulate into.  That tensor keeps its storage for the optimizer's life and has no
    autodiff history; after changing parameters outside the optimizer (loading weights), call
    `refresh_working()`.
    """

    # Sums the gradients' squares in place over processes that each update a shard of the
    # parameters (minitorch.distributed.ShardedAdamW), so the norm and clip are global; None alone.
    _sumsq_reduce: Optional[Callable[[Any], None]] = None

    def __init__(
        self,
        parameters: Sequence[Parameter],
        lr: float = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        max_grad_norm: Optional[float] = None,
        working_dtype: Optional[DType] = None,
    ):
        if max_grad_norm is not None and not max_grad_norm > 0.0:
            raise ValueError(f"AdamW max_grad_norm must be positive or None, got {max_grad_norm}")
        if working_dtype is not None and working_dtype is not bfloat16:
            raise ValueError(f"AdamW working_dtype must be minitorch.bfloat16 or None, got {working_dtype}")
        super().__init__(parameters, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        self.max_grad_norm = max_grad_norm
        self.working_dtype = working_dtype
        self.working: Dict[int, Tensor] = {}
        self._multi: Any = None
        self._norm: Optional[Tensor] = None
        self.refresh_working()

    def working_copy(self, p: Parameter) -> Tensor:
        """The working copy (working_dtype) of parameter p; KeyError naming p when it has none."""
        for i, q in enumerate(self.parameters):
            if q is p and i in self.working:
                return self.working[i]
        raise KeyError(f"AdamW has no working copy of parameter {p!r} (working_dtype={self.working_dtype})")

    def refresh_working(self) -> None:
        """Rewrite every working copy from its parameter's current values (makes them the first time)."""
        if self.working_dtype is None:
            return
        for i, p in enumerate(self.parameters):
            if p.value is None:
                continue
            buffer = current_working_copy(p.value, self.working_dtype)
            if i not in self.working or self.working[i]._tensor is not buffer:
                self.working[i] = p.value._new(buffer)

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        self.begin_step()
        self.update()

    def begin_step(self) -> None:
        """Count the step and queue its learning rate (no kernel, no wait on the GPU)."""
        self.t += 1
        if self._multi_state() is not None:
            self._multi.set_step(float(self.lr), self.t)

    def update(self) -> None:
        """The update of the step begun by `begin_step`."""
        with no_grad():
            params = self._params_with_grad()
            if not params:
                return
            for i, p in params:
                if i not in self.m:
                    self.m[i] = p.value.zeros()
                    self.v[i] = p.value.zeros()
            if self._multi is not None:
                values = [p.value for _, p in params]
                workings = [self._written_copy(i, p.value) for i, p in params]
                self._multi.update(
                    [v._tensor for v in values], [v.grad._tensor for v in values], [self.m[i]._tensor for i, _ in params],
                    [self.v[i]._tensor for i, _ in params], self.max_grad_norm or 0.0, self.beta1, self.beta2, self.eps,
                    self.weight_decay, self._sumsq_reduce, workings,
                )  # fmt: skip
                for (i, _), v, w in zip(params, values, workings):
                    v._version += 1  # written in place: autocast's cached copies of it are stale
                    if w is not None and w is working_copy(v):
                        working_copy_written(v)
                    if i in self.working:
                        self.working[i]._version += 1
            else:
                grads = self._clipped_grads([p.value.grad for _, p in params])
                for (i, p), g in zip(params, grads):
                    adamw_step(
                        p.value, g, self.m[i], self.v[i], float(self.lr), self.beta1, self.beta2, self.eps,
                        self.weight_decay, self.t,
                    )  # fmt: skip
            refresh_working_copies(p.value for _, p in params)

    def _written_copy(self, i: int, value: Tensor) -> Any:
        """The working copy the multi-tensor update of parameter i writes: the one AdamW holds, else
        autocast's when bfloat16 (the kernel's format), else None (cast after the update)."""
        if i in self.working:
            return self.working[i]._tensor
        copy = working_copy(value)
        return copy if copy is not None and copy.dtype is bfloat16 else None

    def grad_norm(self) -> Tensor:
        """Global L2 norm of the gradients of the last update, before clipping: a 0-dim tensor."""
        if self._multi is not None:
            first = self.parameters[0].value
            return first._new(self._multi.grad_norm()).view(())
        if self._norm is None:
            raise RuntimeError("AdamW.grad_norm(): no update has run yet")
        return self._norm

    def _multi_state(self) -> Any:
        if self._multi is None and self.parameters:
            make = hook(self.parameters[0].value.backend.ops, "adamw_multi")
            self._multi = None if make is None else make()
        return self._multi

    def _clipped_grads(self, grads: List[Tensor]) -> List[Tensor]:
        total = (grads[0] * grads[0]).sum()
        for g in grads[1:]:
            total = total + (g * g).sum()
        if self._sumsq_reduce is not None:
            self._sumsq_reduce(total.to_torch())
        self._norm = total**0.5
        if self.max_grad_norm is None:
            return grads
        # max_norm / max(norm, max_norm) is 1 for small gradients and max_norm / norm otherwise.
        scale = self.max_grad_norm / self._norm.clamp(min=self.max_grad_norm)
        return [g * scale for g in grads]
