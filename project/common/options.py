"""Command-line options of the programs: bounded number types and what a program's parser needs.

A program declares each option once, in its argparse parser, with a type that carries the
option's bound (`Bounded`: POSITIVE_INT, FRACTION, ...). The parser rejects a value out of bounds
with a usage error naming the option; `bound_problems` checks a configuration against the same
types, so a configuration that did not come from the command line (a resumed checkpoint's) meets
the same bounds; and `lenient` turns the bounds into plain conversions, for a program that reports
every problem of its input at once instead of the first one.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import minitorch
from project.common.precision import DTYPE_HELP, DTYPES


class InputError(ValueError):
    """Input a program cannot run with; the message says which and how to fix it."""


def option(key: str) -> str:
    """The command-line spelling of a configuration key: n_embd -> --n-embd."""
    return "--" + key.replace("_", "-")


def str2bool(value: str) -> bool:
    """An argparse type for true|false options (also 1|0, yes|no)."""
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


class Bounded:
    """An argparse type for numbers of `kind` (int or float) within bounds: low (<= value, or <
    value when low_open) and high (>= value, or > value when high_open), None for unbounded. `why`
    says what a lower bound stands for, in the message of a value below it."""

    def __init__(
        self, kind: Callable[[str], Any], low: Optional[float] = None, high: Optional[float] = None,
        low_open: bool = False, high_open: bool = False, why: str = "",
    ):  # fmt: skip
        self.kind, self.low, self.high, self.low_open, self.high_open, self.why = kind, low, high, low_open, high_open, why
        self.__name__ = kind.__name__  # argparse names the type in its message for an unparsable value

    def problem(self, value: Any) -> Optional[str]:
        """What is wrong with value ("is outside [0, 1)", "must be >= 0", ...), None when it is in bounds."""
        low_ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
        high_ok = self.high is None or (value < self.high if self.high_open else value <= self.high)
        if isinstance(value, float) and math.isnan(value):
            low_ok = high_ok = False
        if low_ok and high_ok:
            return None
        if self.low is not None and self.high is not None:
            return f"is outside {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.high is not None:
            return f"must be {'<' if self.high_open else '<='} {self.high:g}"
        if self.why:
            return f"is below {self.low:g} ({self.why})"
        if self.low == 0 and self.low_open:
            return "must be positive"
        return f"must be {'>' if self.low_open else '>='} {self.low:g}"

    def __call__(self, text: str) -> Any:
        value = self.kind(text)
        problem = self.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{value} {problem}")
        return value


POSITIVE_INT = Bounded(int, low=1)
NON_NEGATIVE_INT = Bounded(int, low=0)
POSITIVE = Bounded(float, low=0, low_open=True)
NON_NEGATIVE = Bounded(float, low=0)
FRACTION = Bounded(float, low=0, high=1, high_open=True)  # [0, 1): a probability that leaves something
UNIT_INTERVAL = Bounded(float, low=0, high=1)


def add_compute_options(parser: argparse.ArgumentParser, attention: str, loss: str) -> Any:
    """The options of how a program computes the same model (backend, fused kernels, attention path,
    loss path, recomputation, CUDA graphs, matmul precision, dtype), as a group of parser; attention and
    loss: the program's defaults ("naive" or "fused")."""
    how = parser.add_argument_group("how the same model is computed")
    how.add_argument("--backend", choices=("auto", "cuda", "cpu"), default="auto",
                     help="auto: CUDA when a GPU and the built kernels are present, else the CPU (numba)")
    how.add_argument("--use-fused-kernel", type=str2bool, default=True, metavar="true|false",
                     help="fused attention softmax and LayerNorm (CUDA kernels on --backend cuda)")
    how.add_argument("--attention", choices=("naive", "fused"), default=attention,
                     help="naive: scores, softmax and weights as [B, H, T, T] tensors; fused: minitorch.fused_attention")
    how.add_argument("--activation", choices=("softmax", "relu"), default="softmax",
                     help="attention weights: softmax of the causal scores, or their relu without normalization")
    how.add_argument("--loss", choices=("naive", "fused"), default=loss,
                     help="naive: LM-head logits + cross_entropy; fused: fused_linear_cross_entropy (no logits tensor)")
    how.add_argument("--recompute-layers", type=str2bool, default=False, metavar="true|false",
                     help="gradient checkpointing: keep only each transformer layer's input and recompute the "
                     "layer in backward")
    how.add_argument("--cuda-graphs", type=str2bool, default=True, metavar="true|false",
                     help="replay each training (and decoding) step from a CUDA graph (CUDA backend; ignored on the CPU)")
    how.add_argument("--matmul-precision", choices=minitorch.precision.PRECISIONS, default="highest",
                     help=minitorch.precision.PRECISION_HELP)
    how.add_argument("--dtype", choices=DTYPES, default="fp32", help=DTYPE_HELP)
    return how


def bound_problems(parser: argparse.ArgumentParser, config: Mapping[str, Any]) -> List[str]:
    """A line "--name value problem" for every value of config outside the bound of its option's
    type in parser, in the parser's order (None, the "not given" of an optional option, passes)."""
    problems = []
    for action in parser._actions:
        value = config.get(action.dest)
        if isinstance(action.type, Bounded) and value is not None:
            problem = action.type.problem(value)
            if problem is not None:
                problems.append(f"{action.option_strings[0]} {value} {problem}")
    return problems


def lenient(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """parser with its Bounded types reduced to their conversions (int, float): it accepts values
    out of bounds, for a program that reports them all at once (bound_problems)."""
    for action in parser._actions:
        if isinstance(action.type, Bounded):
            action.type = action.type.kind
    return parser


def given_options(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> Dict[str, Any]:
    """The options that argv sets explicitly, parsed by parser (which this changes: a fresh one) with
    every default suppressed and no option required."""
    for action in parser._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    return vars(parser.parse_args(argv))


def backend_from_option(name: str) -> minitorch.BackendChoice:
    """minitorch.choose_backend for a program's --backend option: an InputError (the library's
    reason and fix) where the backend cannot run here."""
    try:
        return minitorch.choose_backend(name)
    except ValueError as err:
        raise InputError(str(err)) from None
