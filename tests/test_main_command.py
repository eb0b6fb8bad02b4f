"""The README's main command on a CPU, after scripts/setup.sh: `python project/run_machine_translation.py`
with no options announces, in its first line, the backend it chose, the tiny preset that --preset auto
picks on a CPU, the model's size, the steps and the estimated time of the whole run; it reaches its
first logged step (the progress bar's first loss) within 3 minutes of CPU time, and Ctrl-C then saves
and exits 0 with the command that continues.

The corpus is the real Multi30k (the program's default place, or $MINITORCH_MT_DATA); without it
the test is skipped. The CPU time (numba's compilation, the tokenizer and the first steps) is
printed (pytest -s shows it)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import minitorch
from mt_program import SCRIPT, WAIT_S
from project.translation import corpus as mt_corpus

CORPUS = Path(os.environ.get(mt_corpus.DATA_DIR_ENV) or mt_corpus.DEFAULT_DATA_DIR)
CPU_LIMIT_S = 180.0
FIRST_LOSS = re.compile(r"epoch 1/2: .* loss=\d")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(bool(mt_corpus.missing_files(CORPUS)), reason=f"the Multi30k corpus is not at {CORPUS}")
@pytest.mark.skipif(minitorch.cuda_unavailable_reason() is None, reason="CUDA runs here: the command trains the full model")
def test_the_readme_command_announces_the_tiny_run_and_logs_a_step_within_3_cpu_minutes(tmp_path) -> None:
    log = tmp_path / "run.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{mt_corpus.DATA_DIR_ENV: str(CORPUS)})
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(SCRIPT)], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
    deadline = time.monotonic() + WAIT_S
    while not FIRST_LOSS.search(log.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no logged step (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    cpu = cpu_seconds(proc.pid)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
    print(f"\nthe README's command logged its first step after {cpu:.1f} s of CPU time")

    lines = log.read_text().split("\n")
    reason = minitorch.cuda_unavailable_reason()
    assert re.fullmatch(
        re.escape(f"backend cpu (auto: CUDA unavailable: {reason}); new run in runs/mt: preset tiny (auto), 232,168 "
                  f"parameters, 80 steps (2 epochs of 40), estimated ") + r"\d+ (s|min) in all", lines[0]), lines[0]  # fmt: skip
    assert re.match(r"stopped by SIGINT in epoch 1/2, step \d+/40; saved runs/mt/checkpoint\.npz; continue with: "
                    r"python .*run_machine_translation\.py --resume --out-dir runs/mt$", lines[-2]), lines[-2]  # fmt: skip
    assert "Traceback" not in log.read_text()
    assert cpu < CPU_LIMIT_S, f"{cpu:.0f} s of CPU time before the first logged step"
