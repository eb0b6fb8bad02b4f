"""The repository's layout rules (docs: the Layout section of the design notes): Python files of at most
450 lines and CUDA sources of at most 800; programs (project/) that use only minitorch's public face
(never minitorch.cuda, a `_`-prefixed name or a tensor's `_storage`); and one package per program,
none importing another, common/ importing neither."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "project"
MAX_PYTHON_LINES = 450
MAX_CUDA_LINES = 800
PYTHON_DIRS = ("minitorch", "project", "tests", "kernel_tests", "benchmarks", "scripts")
PROGRAMS = ("translation", "gpt2")
PRIVATE_ATTRIBUTES = ("_storage", "_tensor")


def files(pattern: str, under: Path = ROOT) -> Iterator[Path]:
    """Files matching pattern under a directory, without caches and version-control internals."""
    for path in sorted(under.rglob(pattern)):
        if not {".git", "__pycache__", ".ipynb_checkpoints"} & set(path.relative_to(ROOT).parts):
            yield path


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def imported_modules(tree: ast.AST) -> Iterator[tuple[str, List[str], int]]:
    """(module, names imported from it, line) of every import statement (absolute imports only)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, [alias.name for alias in node.names], node.lineno


def public_face_problems(source: str, where: str) -> List[str]:
    """What in a program's source reaches past minitorch's public face."""
    tree = ast.parse(source)
    problems = []
    for module, names, line in imported_modules(tree):
        parts = module.split(".")
        if parts[0] != "minitorch":
            continue
        if parts[:2] == ["minitorch", "cuda"] or (module == "minitorch" and "cuda" in names):
            problems.append(f"{where}:{line} imports minitorch.cuda (bindings, not the library's face)")
        private = [p for p in parts[1:] + names if p.startswith("_")]
        if private:
            problems.append(f"{where}:{line} imports the private name(s) {private} from {module}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_ATTRIBUTES:
                problems.append(f"{where}:{node.lineno} touches .{node.attr}")
            elif isinstance(node.value, ast.Name) and node.value.id == "minitorch" and node.attr.startswith("_"):
                problems.append(f"{where}:{node.lineno} uses minitorch.{node.attr}")
    return problems


def package_problems(source: str, where: str, package: str) -> List[str]:
    """Imports of another program's package by a file of project/<package> (common: of any program)."""
    forbidden = [p for p in PROGRAMS if p != package]
    problems = []
    for module, names, line in imported_modules(ast.parse(source)):
        parts = module.split(".")
        if parts[0] != "project":
            continue
        reached = parts[1:2] or [n for n in names if n in PROGRAMS]
        for other in reached:
            if other in forbidden:
                problems.append(f"{where}:{line} ({package}) imports project.{other}: no program imports another")
    return problems


def test_python_files_stay_short() -> None:
    sources = [*ROOT.glob("*.py"), *(p for d in PYTHON_DIRS for p in files("*.py", ROOT / d))]
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sources if (n := line_count(p)) > MAX_PYTHON_LINES]
    assert not long, f"Python files over {MAX_PYTHON_LINES} lines (split them by concept): {long}"


def test_cuda_sources_stay_short() -> None:
    sources = [*files("*.cu", ROOT / "src"), *files("*.cuh", ROOT / "src")]
    assert sources, "no CUDA sources found under src/"
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sources if (n := line_count(p)) > MAX_CUDA_LINES]
    assert not long, f"CUDA files over {MAX_CUDA_LINES} lines (split them by concept): {long}"


def test_programs_use_only_the_public_library() -> None:
    problems = [q for p in files("*.py", PROJECT) for q in public_face_problems(p.read_text(), str(p.relative_to(ROOT)))]
    assert not problems, problems


def test_no_program_imports_another() -> None:
    problems = []
    for package in ("common", *PROGRAMS):
        for path in files("*.py", PROJECT / package):
            problems += package_problems(path.read_text(), str(path.relative_to(ROOT)), package)
    assert not problems, problems


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from minitorch.cuda.graphs import StepGraphs", "imports minitorch.cuda"),
        ("from minitorch import cuda", "imports minitorch.cuda"),
        ("import minitorch.cuda.runtime", "imports minitorch.cuda"),
        ("from minitorch.fused.linear_cross_entropy import _row_block", "private name(s) ['_row_block']"),
        ("from minitorch._private import x", "private name(s) ['_private']"),
        ("y = t._tensor._storage[0:4]", "touches ._storage"),
        ("minitorch._secret()", "uses minitorch._secret"),
    ],
)
def test_the_public_face_check_catches(source: str, expected: str) -> None:
    assert any(expected in problem for problem in public_face_problems(source, "f.py")), source


@pytest.mark.parametrize(
    "source, package, caught",
    [
        ("from project.gpt2.model import GPT2", "translation", True),
        ("from project import translation", "gpt2", True),
        ("import project.translation.corpus", "common", True),
        ("from project.gpt2 import data", "common", True),
        ("from project.common.options import option", "gpt2", False),
        ("from project.translation.batches import Batch", "translation", False),
        ("import minitorch", "common", False),
    ],
)
def test_the_package_check_catches(source: str, package: str, caught: bool) -> None:
    assert bool(package_problems(source, "f.py", package)) == caught, source
