"""What a training program prints when something goes wrong: one line each time.

Bad input (an InputError, a usage error of the parser, any error type a program names) is one
line ``error: ...`` on stderr and exit status 1, never a traceback or argparse's usage block; a
warning is one line ``warning: ...``; an interrupt that could not stop gracefully (a second Ctrl-C,
or one outside the training loop) is one line and status 130.

    def main(argv=None):
        return run_program(lambda: run(argv), (InputError, CheckpointError))
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Optional, Tuple, Type, TypeVar

T = TypeVar("T")
INTERRUPTED_STATUS = 130  # the shell's status for a process ended by SIGINT


def error_line(problem: object) -> str:
    """The one line that reports a problem: ``error: <problem>``, its line breaks joined."""
    return "error: " + "; ".join(line.strip() for line in str(problem).splitlines() if line.strip())


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one ``error:`` line with a hint to --help and exit
    status 1 (not argparse's usage block and status 2), and which takes no abbreviated option
    names (so --resume is never read as --resume-from)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{error_line(message)} (--help lists every option)", file=sys.stderr, flush=True)
        raise SystemExit(1)


def one_line_warning(
    message: Warning | str, category: Type[Warning], filename: str, lineno: int, line: Optional[str] = None
) -> str:
    """warnings.formatwarning as one line: the message, then its category and where it was raised."""
    return f"warning: {message} ({category.__name__}, {Path(filename).name}:{lineno})\n"


def run_program(body: Callable[[], T], input_errors: Tuple[Type[BaseException], ...]) -> T:
    """Run a program's body with warnings formatted as one line each; an exception of input_errors
    becomes SystemExit("error: ...") (status 1), a KeyboardInterrupt one line and status 130."""
    warnings.formatwarning = one_line_warning
    try:
        return body()
    except input_errors as err:
        raise SystemExit(error_line(err)) from None
    except KeyboardInterrupt as err:
        interrupted(str(err))


def interrupted(why: str) -> NoReturn:
    """End the process after an interrupt that could not stop gracefully: one line, status 130."""
    print(f"interrupted{f' ({why})' if why else ''}: stopped without saving; the last checkpoint, if any, is "
          f"as it was", file=sys.stderr, flush=True)  # fmt: skip
    raise SystemExit(INTERRUPTED_STATUS)


def command_line(script: str | os.PathLike, *args: str) -> str:
    """A shell command that runs a program's script with args: the script's path relative to the
    working directory when it lies below it, else absolute."""
    path = Path(script).resolve()
    shown = os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
    return shlex.join(["python", shown, *args])
