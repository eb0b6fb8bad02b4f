"""Count the error reports of one compute-sanitizer log by the kernel each names: this project's
kernels against PyTorch's own (the tests' references), whose names match FOREIGN_REGEX.

    python scripts/sanitizer_report.py LOG FOREIGN_REGEX   ->  prints "<ours> <foreign>"

A report starts at a line "========= <text>" (not the tool's banner or summary) and names its kernel
in "at <kernel>+0x..." on that line (racecheck) or the lines under it (memcheck, initcheck). A report
that names no kernel (a failed API call) counts as ours.  Used by scripts/sanitize.sh: initcheck runs
every kernel instrumented (an uninstrumented writer would leave its output looking uninitialized to the
next reader), so its verdict has to tell whose read it was."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Optional, Tuple

NOT_REPORTS = re.compile(r"^========= (COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application)")
KERNEL = re.compile(r"\bat (.+?)\+0x[0-9a-f]+")


def reports(lines: List[str]) -> List[Optional[str]]:
    """The kernel each report names (None where it names none), in log order."""
    found: List[Optional[str]] = []
    current: Optional[List[str]] = None
    for line in lines + ["========= END"]:
        starts = line.startswith("========= ") and not line.startswith("=========  ") and line.strip() != "========="
        if starts or not line.startswith("========="):
            if current is not None:
                match = next((m for m in map(KERNEL.search, current) if m), None)
                found.append(match.group(1) if match else None)
            current = [line] if starts and not NOT_REPORTS.match(line) and line != "========= END" else None
        elif current is not None:
            current.append(line)
    return found


def split_counts(log: Path, foreign: re.Pattern) -> Tuple[int, int]:
    kernels = reports(log.read_text(errors="replace").splitlines()) if log.exists() else []
    theirs = sum(1 for k in kernels if k is not None and foreign.search(k))
    return len(kernels) - theirs, theirs


if __name__ == "__main__":
    ours, theirs = split_counts(Path(sys.argv[1]), re.compile(sys.argv[2]))
    print(ours, theirs)
