"""argparse value types shared by the programs: each parses one option value or raises
argparse.ArgumentTypeError naming it, so the parser prints a one-line usage error."""

import argparse


def str2bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def fraction(value: str) -> float:
    x = float(value)
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"expected a value in [0, 1), got {value}")
    return x


def non_negative(value: str) -> float:
    x = float(value)
    if x < 0.0:
        raise argparse.ArgumentTypeError(f"expected a value >= 0, got {value}")
    return x


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return n


def nonnegative_int(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return n
