"""One run per output directory (project/common/lock.py): a second run into a directory in use fails at
once with one `error:` line naming the first run's PID and writes nothing there, the first run goes on
unharmed, and the lock goes with its holder however it ends (kill -9 included)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mt_program import ROOT, TINY, WAIT_S, start
from project.common.lock import LOCK_NAME, DirectoryInUse, locked_out_dir
from project.gpt2 import main as gpt2_main
from project.translation import main as run_mt

HOLD = "import sys, time; from project.common.lock import locked_out_dir\nwith locked_out_dir(sys.argv[1]):\n" \
       "    print('held', flush=True); time.sleep(600)"  # fmt: skip


def wait_for_line(proc: subprocess.Popen, log: Path, prefix: str) -> str:
    """The first line of log that starts with prefix, once it is there (fail if proc ends first)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines() if line.startswith(prefix)]
        if lines:
            return lines[0]
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before printing {prefix!r}:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no line {prefix!r} within {WAIT_S}s:\n{log.read_text()[-3000:]}")


def refusal(main, argv: list) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    message = str(info.value)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_a_second_translation_run_is_refused_and_the_first_finishes(corpus_dir, tmp_path) -> None:
    out, log = tmp_path / "run", tmp_path / "first.log"
    first = start(TINY + ["--epochs", "1", "--data-dir", str(corpus_dir), "--out-dir", str(out)], log)
    wait_for_line(first, log, "backend cpu")
    message = refusal(run_mt.main, TINY + ["--epochs", "1", "--data-dir", str(corpus_dir), "--out-dir", str(out)])
    assert message == (f"error: --out-dir {out} is in use by another run (PID {first.pid}); wait for it to end, stop it "
                       f"(Ctrl-C or kill saves a checkpoint there) or choose another --out-dir")  # fmt: skip
    assert "in use by another run" in refusal(run_mt.main, ["--resume", "--out-dir", str(out)])
    assert first.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and "final evaluation (epoch 1)" in text
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1 and (out / "final.json").is_file()
    assert (out / LOCK_NAME).read_text() == "", "a run that ended leaves no PID behind"


def test_a_gpt2_run_into_a_locked_directory_names_the_holder(tmp_path) -> None:
    out = tmp_path / "run"
    with locked_out_dir(out):  # this process holds it: another open file of the lock conflicts
        message = refusal(gpt2_main.main, ["--backend", "cpu", "--out-dir", str(out), "--train-shards", "none_*.bin"])
        assert f"--out-dir {out} is in use by another run (PID {os.getpid()})" in message
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
    assert "matches no file" in refusal(gpt2_main.main, ["--backend", "cpu", "--out-dir", str(out),
                                                          "--train-shards", "none_*.bin"])  # fmt: skip


def test_the_lock_goes_with_its_holder_even_after_kill_9(tmp_path) -> None:
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(DirectoryInUse, match=rf"PID {holder.pid}\)"):
        with locked_out_dir(out):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with locked_out_dir(out) as path:
        assert path.read_text() == f"{os.getpid()}\n"
    with locked_out_dir(out, hold=False):
        assert (out / LOCK_NAME).read_text() == ""
