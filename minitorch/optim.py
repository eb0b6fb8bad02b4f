"""Optimizers: SGD (with momentum), Adam and AdamW (fused and in place on CUDA)."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .autodiff import no_grad
from .fused.adamw import adamw_step
from .module import Parameter
from .tensor_create import tensor_from_numpy


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
                    g = g if buf is None else buf * self.momentum + g
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

    Unlike Adam, it updates IN PLACE: each parameter keeps its tensor and storage, and its moments
    are allocated once (zeros, at its first step) and overwritten after that, so a step allocates
    nothing that outlives it.  The update is `minitorch.fused.adamw_step`: one fused kernel per
    parameter on CUDA (reads p, g, m, v and writes p, m, v: 28 bytes per element), composed tensor
    ops on the CPU backends.  state_dict / load_state_dict are Adam's (step count and moments).
    """

    def __init__(
        self,
        parameters: Sequence[Parameter],
        lr: float = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ):
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"AdamW betas must be in [0, 1), got beta1={beta1}, beta2={beta2}")
        if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
            raise ValueError(f"AdamW needs lr, eps and weight_decay >= 0, got {lr}, {eps}, {weight_decay}")
        super().__init__(parameters, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)

    def step(self) -> None:
        self.t += 1
        with no_grad():
            for i, p in self._params_with_grad():
                value = p.value
                if i not in self.m:
                    self.m[i] = value.zeros()
                    self.v[i] = value.zeros()
                adamw_step(
                    value, value.grad, self.m[i], self.v[i], float(self.lr), self.beta1, self.beta2, self.eps,
                    self.weight_decay, self.t,
                )  # fmt: skip
