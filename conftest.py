"""pytest setup shared by tests/ and kernel_tests/: skipped tests are reported once per reason.

pyproject.toml's addopts leave skips out of pytest's short summary (one line per test location);
this lists each reason once with its count instead, so a machine without a GPU reports its skipped
kernel tests in a line, not in dozens of identical ones."""

from collections import Counter
from typing import Any


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped:
        for reason, count in Counter(map(_reason, skipped)).most_common():
            terminalreporter.write_line(f"{count} skipped: {reason}")
