"""Every benchmark script imports what it uses and parses its options: `--help` exits 0 (the
benchmarks themselves run on the GPU machine, where a broken import would cost a device call)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.name for p in BENCHMARKS])
def test_help_runs(script: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_profile_kernels_runs_a_program_and_names_a_missing_one(tmp_path: Path) -> None:
    """The program runs as __main__ with its own arguments; on a machine without a GPU the table is
    empty. No program, or a missing file, is a usage error."""
    program = tmp_path / "program.py"
    program.write_text("import sys\nif __name__ == '__main__':\n    print('ran with', sys.argv[1:])\n")
    out = tmp_path / "kernels.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "profile_kernels.py"), "--out", str(out), "--", str(program), "x"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ran with ['x']" in done.stdout and "kernels," in done.stdout
    assert out.exists()
    for tail in ([], ["--", str(tmp_path / "missing.py")]):
        done = subprocess.run(cmd[:2] + tail, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and ("give the program" in done.stderr or "missing.py" in done.stderr)
