"""Scalar math used by every layer of minitorch, and its derivatives.

Each function takes and returns Python floats; those in INTEGER_OPS also compute int64 tensors in
integers (the others see int64 inputs converted to float32 first).  The backends compile these same
functions (numba on the CPU) or map them to opcodes of their kernels (CUDA), so a function here is
the single definition of an operation's meaning.  As in PyTorch, max and min propagate NaN.
"""

from __future__ import annotations

import math

GELU_C = math.sqrt(2.0 / math.pi)
SQRT1_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
EPS = 1e-6


def mul(x: float, y: float) -> float:
    """x * y"""
    return x * y


def id(x: float) -> float:
    """The identity."""
    return x


def add(x: float, y: float) -> float:
    """x + y"""
    return x + y


def neg(x: float) -> float:
    """-x"""
    return -x


def lt(x: float, y: float) -> float:
    """1.0 if x < y else 0.0"""
    return 1.0 if x < y else 0.0


def eq(x: float, y: float) -> float:
    """1.0 if x == y else 0.0"""
    return 1.0 if x == y else 0.0


def max(x: float, y: float) -> float:
    """The larger of x and y; NaN when either is NaN."""
    return x if x > y or x != x else y


def min(x: float, y: float) -> float:
    """The smaller of x and y; NaN when either is NaN."""
    return x if x < y or x != x else y


def abs(x: float) -> float:
    """|x| (NaN stays NaN)."""
    return x if x > 0 else -x


def floordiv(x: int, y: int) -> int:
    """x // y for integers, rounded toward negative infinity (Python's and PyTorch's floor division);
    0 for y == 0, which the CPU backends refuse before computing (float tensors compose floor)."""
    return x // y if y != 0 else 0


def remainder(x: int, y: int) -> int:
    """x - (x // y) * y for integers: the remainder with the sign of y (Python's %, torch.remainder);
    0 for y == 0, as floordiv."""
    return x % y if y != 0 else 0


def sqrt(x: float) -> float:
    """Square root; nan below 0."""
    return math.sqrt(x) if x >= 0.0 else math.nan


def sin(x: float) -> float:
    """Sine."""
    return math.sin(x)


def cos(x: float) -> float:
    """Cosine."""
    return math.cos(x)


def floor(x: float) -> float:
    """The largest integer <= x (as a float); from 2^52 on every float is one (nan and inf too)."""
    if not (-4503599627370496.0 < x < 4503599627370496.0):
        return x
    return float(math.floor(x))


def is_close(x: float, y: float) -> float:
    """1.0 if |x - y| < 1e-2 else 0.0"""
    return 1.0 if -1e-2 < x - y < 1e-2 else 0.0


def sigmoid(x: float) -> float:
    """1 / (1 + e^-x), computed without overflow for large |x|."""
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def relu(x: float) -> float:
    """max(x, 0)"""
    return x if x > 0.0 else 0.0


def log(x: float) -> float:
    """Natural log; -inf at 0, like the other backends."""
    return math.log(x) if x > 0.0 else (-math.inf if x == 0.0 else math.nan)


def exp(x: float) -> float:
    """e^x; inf on overflow (nan stays nan), like the other backends."""
    if x >= 709.0:
        return math.inf
    return math.exp(x)


def div(x: float, y: float) -> float:
    """x / y, IEEE's: +-inf or nan for y == 0."""
    if y == 0.0:
        return x * math.copysign(math.inf, y)
    return x / y


def inv(x: float) -> float:
    """1 / x"""
    return 1.0 / x if x != 0.0 else math.copysign(math.inf, x)


def pow(x: float, y: float) -> float:
    """x ** y (nan where a negative base meets a fractional exponent)."""
    if x < 0.0 and y != math.floor(y):
        return math.nan
    if x == 0.0 and y < 0.0:
        return math.inf
    return x**y


def tanh(x: float) -> float:
    """Hyperbolic tangent."""
    return math.tanh(x)


def gelu(x: float) -> float:
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + math.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def gelu_erf(x: float) -> float:
    """The exact GELU: 0.5 x (1 + erf(x / sqrt(2))) (torch's default; gelu is the tanh approximation)."""
    return 0.5 * x * (1.0 + math.erf(x * SQRT1_2))


def gelu_erf_back(x: float, d: float) -> float:
    """d * d/dx gelu_erf(x) = d * (Phi(x) + x phi(x))."""
    return d * (0.5 * (1.0 + math.erf(x * SQRT1_2)) + x * math.exp(-0.5 * x * x) * INV_SQRT_2PI)


def log_back(x: float, d: float) -> float:
    """d * d/dx log(x)"""
    return d / x


def inv_back(x: float, d: float) -> float:
    """d * d/dx (1/x)"""
    return -d / (x * x)


def relu_back(x: float, d: float) -> float:
    """d * d/dx relu(x)"""
    return d if x > 0.0 else 0.0


def sigmoid_back(y: float, d: float) -> float:
    """d * sigmoid'(x) written in terms of the output y = sigmoid(x)."""
    return d * y * (1.0 - y)


def tanh_back(y: float, d: float) -> float:
    """d * tanh'(x) written in terms of the output y = tanh(x)."""
    return d * (1.0 - y * y)


def gelu_back(x: float, d: float) -> float:
    """d * d/dx gelu(x) for the tanh approximation."""
    inner = GELU_C * (x + 0.044715 * x * x * x)
    t = math.tanh(inner)
    dinner = GELU_C * (1.0 + 3.0 * 0.044715 * x * x)
    return d * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)


# The ops that compute int64 tensors in integers (exact to 2^63); comparisons among them give bool.
INTEGER_OPS = (id, neg, abs, add, mul, max, min, lt, eq, floordiv, remainder)
