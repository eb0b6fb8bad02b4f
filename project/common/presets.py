"""--preset of the training programs: named sets of defaults, which options given on the command line
still override. Every program has "full" (its own defaults: the real run, for a GPU) and "tiny"
(minutes on a 2-core CPU); "auto", the default, picks "full" where the run will train on CUDA and
"tiny" where it will train on the CPU, so the same command suits either machine.

    parser = program_parser("What the program does.", PRESETS)   # or add_preset_option(parser, PRESETS)
    name = apply_preset(parser, PRESETS, argv)      # "full" or "tiny"; the parser's defaults now follow it
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import minitorch
from project.common.console import OneLineParser

AUTO = "auto"
Presets = Mapping[str, Mapping[str, Any]]


def _spelled(values: Mapping[str, Any]) -> str:
    return " ".join(f"--{key.replace('_', '-')} {value}" for key, value in values.items())


def add_preset_option(parser: argparse.ArgumentParser, presets: Presets) -> None:
    """--preset {auto, <presets>} with a help text listing what each preset sets."""
    described = "; ".join(f"{name}: {_spelled(values) or 'the defaults below'}" for name, values in presets.items())
    parser.add_argument("--preset", choices=(AUTO, *presets), default=AUTO,
                        help=f"defaults for the run, explicit options still win; auto: full where the run trains on "
                        f"CUDA, tiny on a CPU; {described}")  # fmt: skip


def program_parser(description: str, presets: Presets) -> argparse.ArgumentParser:
    """A training program's parser: one-line usage errors (OneLineParser), every default shown by
    --help, and --preset as its first option."""
    parser = OneLineParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_preset_option(parser, presets)
    return parser


def preset_for(backend: str) -> str:
    """The preset "auto" stands for with a --backend option: "full" for a run on CUDA, else "tiny"."""
    on_cuda = backend == "cuda" or (backend == "auto" and minitorch.choose_backend("auto").name == "cuda")
    return "full" if on_cuda else "tiny"


def resolve_preset(name: str, backend: str) -> str:
    """A --preset value with "auto" resolved for the --backend option."""
    return preset_for(backend) if name == AUTO else name


def apply_preset(parser: argparse.ArgumentParser, presets: Presets, argv: Optional[Sequence[str]]) -> str:
    """Set the parser's defaults to the preset argv asks for (auto resolved with argv's --backend)
    and return its name; the parser needs --preset and --backend options."""
    known = parser.parse_known_args(argv)[0]
    name = resolve_preset(known.preset, known.backend)
    parser.set_defaults(**presets[name])
    return name
