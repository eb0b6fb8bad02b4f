"""The translation program survives interruption: kill -9 at a random step and SIGINT, each followed by
--resume, end with the parameters, optimizer state and metrics of an uninterrupted run, bit for bit
(CPU backend, fixed seed); a corrupted checkpoint is refused and the previous good one kept.

The kill -9 hits a subprocess; SIGINT goes to this process while main() runs in it (sent from a
thread), which is the same handler path and spares a second numba compilation."""

import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest

from mt_program import TINY, WAIT_S, computed, load, saved_step, start, wait_for_step
from project import run_machine_translation as run_mt
from project.common.checkpoint import load_checkpoint
from project.translation.options import CHECKPOINT_KIND


def interrupt_at(out_dir, step: int, done: threading.Event) -> threading.Thread:
    """A thread sending SIGINT to this process once out_dir's checkpoint reaches `step`."""

    def watch() -> None:
        deadline = time.monotonic() + WAIT_S
        while not done.is_set() and time.monotonic() < deadline:
            if saved_step(out_dir) >= step:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_kill_9_then_sigint_then_resume_equals_the_uninterrupted_run(straight_run, corpus_dir, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    rng = np.random.default_rng()
    kill_at = int(rng.integers(2, 7))  # epoch 1 has 8 steps
    log = tmp_path / "first.log"
    first = start(TINY + ["--epochs", "2", "--data-dir", str(corpus_dir), "--out-dir", str(out),
                          "--save-every-steps", "1"], log)  # fmt: skip
    wait_for_step(first, out, kill_at, log)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_at = saved_step(out)
    assert killed_at >= kill_at, f"kill -9 after step {kill_at}"
    assert log.read_text().startswith("backend cpu (requested: numba FastOps); new run in ")

    saved = load(out)
    partial = saved["progress"]["partial"]
    if partial is None:
        epoch, step = saved["progress"]["epoch"] + 1, 0
    else:
        epoch, step = partial["epoch"], 8 if partial["trained"] else saved["batcher"]["batches_done"]
    where = f"epoch {epoch}/2, step {step}/8"  # the resumed run's lines and its progress bar count alike

    stop_at = killed_at + int(rng.integers(2, 5))  # crosses epoch 1's evaluation for some draws
    done = threading.Event()
    watcher = interrupt_at(out, stop_at, done)
    try:
        stopped = run_mt.main(["--resume", "--out-dir", str(out)])
    finally:
        done.set()
        watcher.join()
    assert stopped["stopped"] == "SIGINT", "main() returns normally (the script exits 0) after a SIGINT"
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("backend cpu (requested: numba FastOps); resuming in ")
    assert f", {killed_at} done ({where}), estimated " in lines[0] and lines[1].startswith(f"resuming in {where} (")
    assert f"epoch {epoch}/2:" in captured.err and f"| {step}/8 [" in captured.err
    assert lines[-1].startswith("stopped by SIGINT in epoch ") and lines[-1].endswith(
        f"continue with: python {os.path.relpath(run_mt.__file__)} --resume --out-dir {out}"
    )
    stopped_at = saved_step(out)
    assert stopped_at >= stop_at

    resumed = run_mt.main(["--resume", "--out-dir", str(out)])
    context = f"(killed after step {killed_at}, SIGINT after step {stopped_at})"
    expected, got = load(straight_run["out_dir"]), load(out)
    assert got["progress"] == expected["progress"] == {"epoch": 2, "step": 16, "partial": None}
    for name, value in expected["model"].items():
        np.testing.assert_array_equal(got["model"][name], value, err_msg=f"{name} {context}")
    for moment in ("m", "v"):
        for i, value in expected["optimizer"][moment].items():
            np.testing.assert_array_equal(got["optimizer"][moment][i], value, err_msg=f"{moment}[{i}] {context}")
    assert computed(resumed["history"]) == computed(straight_run["history"]), context
    for name in ("translations_epoch1.txt", "translations_epoch2.txt"):
        assert (out / name).read_text() == (straight_run["out_dir"] / name).read_text(), context


@pytest.mark.parametrize("damage", ["truncate", "empty", "foreign"])
def test_a_corrupted_checkpoint_is_refused_and_the_previous_one_kept(straight_run, tmp_path, damage: str) -> None:
    out = tmp_path / "run"
    shutil.copytree(straight_run["out_dir"], out)
    latest, prev = out / "checkpoint.npz", out / "checkpoint.prev.npz"
    data = latest.read_bytes()
    latest.write_bytes({"truncate": data[: len(data) // 3], "empty": b"", "foreign": b"\x80\x04K\x01."}[damage])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(SystemExit) as info:
        run_mt.main(["--resume", "--out-dir", str(out)])
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"error: {latest} ")
    assert {"truncate": "is truncated or damaged", "empty": "is empty", "foreign": "looks like a pickle"}[damage] in message
    assert (f"refused and left as it is. The previous checkpoint {prev} is a 'machine_translation' checkpoint at "
            f"epoch 1, step 8: to continue from it, move it to {latest}") in message  # fmt: skip
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "nothing was written"
    with pytest.raises(SystemExit, match=r"checkpoint\.npz exists; pass --resume"):
        run_mt.main(TINY + ["--out-dir", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert load_checkpoint(prev, CHECKPOINT_KIND).state["progress"] == {"epoch": 1, "step": 8, "partial": None}
