"""End to end on FastOps: a 2-layer MLP trained with Adam separates a generated 2-D dataset."""

import numpy as np
from minitorch_testing import FAST, mt

import minitorch
from minitorch import Adam, Linear, Module, nn


class MLP(Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layer1 = Linear(2, hidden, backend=FAST)
        self.layer2 = Linear(hidden, 2, backend=FAST)

    def forward(self, x):
        return self.layer2(self.layer1(x).relu())


def circle_dataset(n: int, seed: int):
    """Points uniform in [-1, 1]^2, class 1 inside the circle of radius 0.7 (about 38% of them)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (n, 2)).astype(np.float32)
    y = ((x**2).sum(axis=1) < 0.49).astype(np.float32)
    return x, y


def accuracy(model: MLP, x: np.ndarray, y: np.ndarray) -> float:
    with minitorch.no_grad():
        logits = model(mt(x, FAST)).to_numpy()
    return float((logits.argmax(axis=1) == y).mean())


def test_mlp_learns_a_circle_with_adam() -> None:
    minitorch.manual_seed(0)
    x, y = circle_dataset(256, seed=1)
    x_test, y_test = circle_dataset(512, seed=2)
    model = MLP(hidden=24)
    opt = Adam(model.parameters(), lr=0.05)
    tx, ty = mt(x, FAST), mt(y, FAST)
    losses = []
    for _ in range(100):
        opt.zero_grad()
        loss = nn.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    assert accuracy(model, x, y) >= 0.95
    assert accuracy(model, x_test, y_test) >= 0.93
