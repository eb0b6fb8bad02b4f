"""The dtypes of minitorch tensors: float32 (the default), bfloat16, float16, int64 and bool;
promotion as in PyTorch; rounding to the 16-bit formats on the host.

Storage: a CUDA tensor's storage holds its dtype's own format (`storage`: 4 bytes for float32 and
for bool, whose 1.0/0.0 values are float32; 2 bytes for bfloat16 and float16; 8 for int64).  The
CPU backends keep int64 in int64 storage (exact to 2^63) and every other dtype in float32 storage
holding exactly the dtype's values: each op whose output is a 16-bit dtype rounds it (to nearest,
ties to even) with `DType.round`, so CPU results carry the same rounding as the GPU's kernels.

Promotion (`promote_types`, `result_type`) follows PyTorch: bool < int64 < the floats; two floats
give the smallest float holding both (bfloat16 with float32 -> float32, bfloat16 with float16 ->
float32); a 0-dim tensor does not promote a tensor with dims of its own category, and a Python
number never promotes a tensor of its category (bfloat16 tensor * 2.5 stays bfloat16, int64 tensor
* 2 stays int64, int64 tensor * 2.5 is float32).  An op between int64 and a float computes in the
float (the int64 operand converted first, as PyTorch does); an int64 converts to a 16-bit float
through float32 (two roundings, which can differ from PyTorch's one only for |x| > 2^24).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

Array = np.ndarray

KINDS = "bif"  # categories, lowest first: bool, integer, floating
FLOAT32_EXACT_INTEGERS = 1 << 24  # float32 holds every integer of magnitude up to here


def _bf16_bits(values: Array) -> Array:
    """uint16 bfloat16 patterns of float32 values, rounded to nearest, ties to even.

    Adding 0x7FFF plus the lowest kept bit to the float32 pattern and dropping its low 16 bits rounds
    to nearest even; a carry out of the mantissa moves to the next binade (the largest finite floats
    go to infinity, as IEEE rounding does).  NaNs keep their sign and top payload bits, made quiet
    (the rounding carry could otherwise turn one into an infinity)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x0040)
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def _bf16_values(bits: Array) -> Array:
    """float32 values of bfloat16 patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f16_bits(values: Array) -> Array:
    """uint16 float16 patterns of float32 values (NumPy's cast rounds to nearest even; beyond the
    range it gives infinities, as intended)."""
    with np.errstate(over="ignore"):
        return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16)


def _f16_values(bits: Array) -> Array:
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


class DType:
    """A tensor dtype.  `name` is PyTorch's (torch.<name> is the torch equivalent); `itemsize` is
    the bytes per element of its CUDA storage; `storage` the name of the storage format (bool is
    stored as float32 1.0/0.0, int64 as int64); `numpy` the NumPy equivalent (None for bfloat16,
    which NumPy lacks); floats have `exponent_bits` and `mantissa_bits` (explicit ones).

    minitorch.float32 == np.float32 holds, as minitorch.bool == np.bool_ (and minitorch.bfloat16 ==
    ml_dtypes.bfloat16): a DType compares equal to the NumPy dtype of its name, and
    np.dtype(minitorch.float32) works."""

    def __init__(
        self, name: str, kind: str, itemsize: int, storage: str, numpy: Optional[Any],
        exponent_bits: int = 0, mantissa_bits: int = 0,
        codec: Optional[Tuple[Callable[[Array], Array], Callable[[Array], Array]]] = None,
    ):  # fmt: skip
        self.name = name
        self.kind = kind
        self.itemsize = itemsize
        self.storage = storage
        self.numpy = None if numpy is None else np.dtype(numpy)
        self.exponent_bits = exponent_bits
        self.mantissa_bits = mantissa_bits
        self._codec = codec

    @property
    def is_floating(self) -> bool:
        return self.kind == "f"

    @property
    def is_integer(self) -> bool:
        """int64 (bool, whose values are 1.0/0.0 numbers, is not)."""
        return self.kind == "i"

    @property
    def rounds(self) -> bool:
        """Whether float32 values must be rounded to be values of this dtype (the 16-bit floats)."""
        return self._codec is not None

    @property
    def dtype(self) -> np.dtype:
        """NumPy's protocol (np.dtype(x) reads x.dtype): the NumPy equivalent."""
        if self.numpy is None:
            raise TypeError(f"NumPy has no {self.name} dtype; minitorch hands {self.name} values to NumPy as float32")
        return self.numpy

    def round(self, values: Array) -> Array:
        """float32 values rounded to this dtype's values (nearest, ties to even; NaN and inf kept),
        as a float32 array; float32 and bool values are returned as they are."""
        if self._codec is None:
            return np.asarray(values, dtype=np.float32)
        return self.decode(self.encode(values)).reshape(np.shape(values))

    def host_values(self, values: Array) -> Array:
        """values (any numeric array) as this dtype's CPU storage holds them: int64 converted (floats
        truncated toward zero, as a cast does), the others as float32 rounded to the dtype."""
        if self.is_integer:
            return np.asarray(values).astype(np.int64)
        return self.round(np.asarray(values, dtype=np.float32))

    def encode(self, values: Array) -> Array:
        """The storage words of float32 values in this 16-bit dtype (uint16, rounded as `round`)."""
        if self._codec is None:
            raise TypeError(f"{self.name} has no 16-bit encoding")
        return self._codec[0](values)

    def decode(self, words: Array) -> Array:
        """float32 values of this 16-bit dtype's storage words (exact)."""
        if self._codec is None:
            raise TypeError(f"{self.name} has no 16-bit encoding")
        return self._codec[1](words)

    def __repr__(self) -> str:
        return f"minitorch.{self.name}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DType):
            return other is self
        try:
            return np.dtype(other).name == self.name  # type: ignore[call-overload]
        except TypeError:
            return False

    def __hash__(self) -> int:
        return hash(self.name)


float32 = DType("float32", "f", 4, "float32", np.float32, exponent_bits=8, mantissa_bits=23)
bfloat16 = DType("bfloat16", "f", 2, "bfloat16", None, exponent_bits=8, mantissa_bits=7, codec=(_bf16_bits, _bf16_values))
float16 = DType("float16", "f", 2, "float16", np.float16, exponent_bits=5, mantissa_bits=10, codec=(_f16_bits, _f16_values))
int64 = DType("int64", "i", 8, "int64", np.int64)
bool_ = DType("bool", "b", 4, "float32", np.bool_)  # minitorch.bool: 1.0/0.0 values that index as a mask

DTYPES: Dict[str, DType] = {t.name: t for t in (float32, bfloat16, float16, int64, bool_)}
# The dtype a Python number of each kind stands for when it decides a result's category.
_SCALAR_DEFAULTS = {"b": bool_, "i": int64, "f": float32}


def dtype_named(name: str) -> DType:
    """The DType called name ("float32", "bfloat16", "float16", "int64", "bool")."""
    found = DTYPES.get(name)
    if found is None:
        raise ValueError(f"unknown minitorch dtype {name!r}; the dtypes are {', '.join(DTYPES)}")
    return found


def as_dtype(value: Any) -> DType:
    """value as a minitorch DType: a DType, its name, or the NumPy equivalent of one (np.float32,
    np.float16, np.int64, np.bool_); TypeError naming value otherwise (float64 included: minitorch
    has no 64-bit float)."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    found = next((t for t in DTYPES.values() if t == value), None)
    if found is None:
        raise TypeError(f"expected a minitorch dtype ({', '.join(repr(t) for t in DTYPES.values())}), got {value!r}")
    return found


def promote_types(a: DType, b: DType) -> DType:
    """The dtype that holds both a and b (torch.promote_types): the higher category, and between two
    floats the smallest float with at least both's exponent and mantissa bits."""
    if a is b:
        return a
    if a.kind != b.kind:
        return a if KINDS.index(a.kind) > KINDS.index(b.kind) else b
    wide = [t for t in DTYPES.values() if t.kind == a.kind and t.exponent_bits >= max(a.exponent_bits, b.exponent_bits)
            and t.mantissa_bits >= max(a.mantissa_bits, b.mantissa_bits)]  # fmt: skip
    return min(wide, key=lambda t: t.itemsize)


def _kind_of(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "b"
    if isinstance(value, (int, np.integer)):
        return "i"
    if isinstance(value, (float, np.floating)):
        return "f"
    raise TypeError(f"result_type takes tensors and Python numbers, got {type(value).__name__} {value!r}")


def _promote_all(dtypes: Any) -> Optional[DType]:
    out: Optional[DType] = None
    for t in dtypes:
        out = t if out is None else promote_types(out, t)
    return out


def result_type(*operands: Any) -> DType:
    """The dtype of an op's result over its operands (torch.result_type's rules): tensors (anything
    with .dtype and .dims: a Tensor or a TensorData) and Python numbers.  Tensors with dims decide;
    a 0-dim tensor counts only when it is of a higher category than they are, a Python number only
    when it is of a higher category than every tensor (then the default dtype of its kind)."""
    dimensioned = [o.dtype for o in operands if hasattr(o, "dtype") and o.dims > 0]
    zero_dim = [o.dtype for o in operands if hasattr(o, "dtype") and o.dims == 0]
    numbers = [_kind_of(o) for o in operands if not hasattr(o, "dtype")]
    out = _promote_all(dimensioned)
    low = _promote_all(zero_dim)
    if out is None or (low is not None and KINDS.index(low.kind) > KINDS.index(out.kind)):
        out = low
    if numbers:
        kind = max(numbers, key=KINDS.index)
        if out is None or KINDS.index(kind) > KINDS.index(out.kind):
            out = _SCALAR_DEFAULTS[kind]
    if out is None:
        raise ValueError("result_type needs at least one operand")
    return out


def arithmetic(dtype: DType) -> DType:
    """The dtype elementwise arithmetic gives on values of dtype: itself, except bool, whose sums and
    products are float32 numbers (PyTorch keeps bool + bool a bool; a bool's sum() is int64 in both)."""
    return float32 if dtype is bool_ else dtype


class NoKernelError(NotImplementedError):
    """An op was asked of a backend that has no kernel for its dtype (nothing is computed in another
    precision behind the caller's back)."""


def no_kernel(op: str, dtype: DType, device: str = "CUDA") -> NoKernelError:
    """The error for an op without a kernel for dtype, naming the op, the dtype and the way out."""
    return NoKernelError(f"minitorch: no {dtype.name} {device} kernel for {op!r} (cast with .float() first)")
