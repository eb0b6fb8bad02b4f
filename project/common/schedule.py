"""The learning-rate schedule of the training programs: linear warm-up, then a cosine decay."""

from __future__ import annotations

import math


def learning_rate(step: int, peak: float, warmup_steps: int, total_steps: int, final_fraction: float = 0.0) -> float:
    """The rate of update `step` (counted from 0): linear warm-up to `peak` over warmup_steps
    updates, then a cosine decay from peak to peak * final_fraction at total_steps (0: to zero; 1:
    constant after the warm-up, llm.c's default) and flat after it."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    floor = peak * final_fraction
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)
