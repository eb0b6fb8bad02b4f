"""The validation loss of the training programs: a model's mean loss over batches, summed on the
backend and read once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Optional, Tuple, TypeVar

from tqdm import tqdm

import minitorch
from minitorch import Module, Tensor

B = TypeVar("B")


def validation_loss(
    model: Module, batches: Iterable[B], loss_of: Callable[[B], Tuple[Tensor, float]], total: Optional[int] = None,
    show: bool = True,
) -> float:  # fmt: skip
    """Sum over batches of loss_of(batch)'s loss sum, divided by the sum of its counts (tokens, or
    1 for a batch's mean loss), in eval mode without gradients (the model's mode is restored). A bar
    (unless not show) counts the batches out of `total`. ValueError when the counts sum to 0."""
    was_training = model.training
    model.eval()
    summed: Optional[Tensor] = None
    count = 0.0
    try:
        with minitorch.no_grad(), tqdm(total=total, desc="validation loss", unit="batch", leave=False, disable=not show) as bar:
            for batch in batches:
                loss, weight = loss_of(batch)
                summed = loss if summed is None else summed + loss
                count += weight
                bar.update(1)
    finally:
        if was_training:
            model.train()
    if summed is None or count == 0:
        raise ValueError("validation needs at least one target token, got none")
    return summed.item() / count
