"""The programs' data parallelism on the CPU (gloo): both programs' own training code on tiny models on
SimpleOps (no numba compilation in each process), through scripts/ddp_programs.py under torchrun.

- the same global batch trains the same model on 1 and 2 processes, also in micro-batches and with
  ZeRO-1 (whose gathered AdamW state equals plain AdamW's);
- a checkpoint written by 2 processes (ZeRO-1) resumes in 1, and one written by 1 process in 2;
- two "nodes", each started as its own torchrun command (c10d rendezvous), train as one node of 2;
- SIGKILL of one of two processes ends the other within the lost-rank timeout, exit status
  LOST_PEER_EXIT, with a message naming the lost rank; the last checkpoint is intact and resumes.

One parameter is left out of the comparisons of runs on different numbers of processes: the key part
of the attention's qkv bias.  Its gradient is zero in exact arithmetic (softmax does not change when
every score of a row moves by the same amount), so what it gets is rounding noise, which AdamW
divides by its own magnitude into steps of about lr whose sign depends on the summation order.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minitorch.distributed import LOST_PEER_EXIT
from project.common.checkpoint import CheckpointError, load_checkpoint
from project.gpt2.llmc import read_checkpoint, write_shard
from project.translation.options import CHECKPOINT_KIND

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "scripts" / "ddp_programs.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
KEY_BIAS = "layers.0.attention.qkv_projection.bias"
N_EMBD = 8  # scripts/ddp_programs.py's TINY
TOLERANCE = 1e-5  # largest |difference| / largest |value| of a tensor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, processes: int = 1) -> subprocess.Popen:
    """scripts/ddp_programs.py with these arguments, alone or under torchrun."""
    command = [sys.executable, SCRIPT, *args]
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
                   SCRIPT, *args]  # fmt: skip
    return subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(*runs: subprocess.Popen) -> str:
    """Wait for the runs (started together: two cores); the output of the last."""
    logs = [run.communicate(timeout=300)[0] for run in runs]
    for run, log in zip(runs, logs):
        assert run.returncode == 0, log[-4000:]
    return logs[-1]


def launch(args, processes: int = 1) -> str:
    return finish(start(args, processes))


def translation(out: Path, processes: int = 1, *options: str) -> Path:
    launch(["translation", "--simple", "--out", str(out), *options], processes)
    return out


def state(out: Path) -> dict:
    return load_checkpoint(out / "checkpoint.npz", CHECKPOINT_KIND).state


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def assert_same_training(got: dict, want: dict, context: str, exact: bool = False) -> None:
    """Equal progress; parameters and AdamW moments equal within TOLERANCE (exact: bit for bit), the
    key bias left out of the parameters (see the module docstring)."""
    assert got["progress"] == want["progress"], context
    for name, value in want["model"].items():
        mine = got["model"][name]
        if name == KEY_BIAS and not exact:
            mine, value = np.delete(mine, np.s_[N_EMBD : 2 * N_EMBD]), np.delete(value, np.s_[N_EMBD : 2 * N_EMBD])
        assert (np.array_equal(mine, value) if exact else relative(mine, value) <= TOLERANCE), f"{name} {context}"
    for moment in ("m", "v"):
        for i, value in want["optimizer"][moment].items():
            mine = got["optimizer"][moment][i]
            assert (np.array_equal(mine, value) if exact else relative(mine, value) <= TOLERANCE), f"{moment}[{i}] {context}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two epochs (10 steps of 8 pairs) of the translation run: on one process, in micro-batches of
    3 pairs on one, on two, and on two with ZeRO-1 in micro-batches of 2."""
    root = tmp_path_factory.mktemp("translation")
    options = {"one": (1,), "one_micro": (1, "--micro-batch-size", "3"), "two": (2,),
               "two_zero_micro": (2, "--zero", "1", "--micro-batch-size", "2")}  # fmt: skip
    for pair in (("one", "one_micro"), ("two", "two_zero_micro")):
        finish(*(start(["translation", "--simple", "--out", str(root / name), *options[name][1:]], options[name][0])
                 for name in pair))  # fmt: skip
    return {name: root / name for name in options}


def test_the_same_global_batch_trains_alike_on_one_and_two_processes(runs) -> None:
    want = state(runs["one"])
    assert want["progress"] == {"epoch": 2, "step": 10, "partial": None}
    for name in ("one_micro", "two", "two_zero_micro"):
        assert_same_training(state(runs[name]), want, f"({name} against one process)")


def test_zero_1_trains_as_plain_data_parallel(runs) -> None:
    """Two processes each way (one of them in micro-batches): parameters and the gathered moments agree
    to rounding."""
    assert_same_training(state(runs["two_zero_micro"]), state(runs["two"]), "(ZeRO-1 against all-reduce)")


@pytest.mark.parametrize("first, then", [((2, "--zero", "1"), (1,)), ((1,), (2, "--zero", "1"))],
                         ids=["2 ZeRO-1 -> 1", "1 -> 2 ZeRO-1"])  # fmt: skip
def test_a_checkpoint_resumes_on_another_number_of_processes(runs, tmp_path, first, then) -> None:
    """Stopped mid-epoch (step 3 of 5) and resumed: the same data order and the same model."""
    out = tmp_path / "run"
    translation(out, first[0], *first[1:], "--stop-at-step", "3")
    assert state(out)["progress"]["step"] == 3 and state(out)["progress"]["partial"]["epoch"] == 1
    translation(out, then[0], *then[1:], "--resume")
    assert_same_training(state(out), state(runs["one"]), f"(processes {first[0]} then {then[0]})")


def test_two_nodes_launched_apart_train_as_one_node(runs, tmp_path) -> None:
    """torchrun --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d, one command per "node"."""
    out, port = tmp_path / "run", free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", SCRIPT, "translation", "--simple",
               "--out", str(out)]  # fmt: skip
    nodes = [subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]  # fmt: skip
    logs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(log[-2000:] for log in logs)
    assert_same_training(state(out), state(runs["two"]), "(two nodes against one)", exact=True)


def saved_step(out: Path) -> int:
    try:
        return state(out)["progress"]["step"]
    except CheckpointError:
        return -1


def test_a_killed_process_ends_the_other_with_a_message_and_the_run_resumes(tmp_path) -> None:
    """Each process started as its own command (as on two hosts: no launcher kills the survivor)."""
    out, port, timeout = tmp_path / "run", free_port(), 5.0
    logs, workers = [], []
    for rank in range(2):
        env = {**ENV, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}  # fmt: skip
        logs.append(tmp_path / f"rank{rank}.log")
        with open(logs[-1], "w") as log:
            workers.append(subprocess.Popen(
                [sys.executable, SCRIPT, "translation", "--simple", "--out", str(out), "--epochs", "3",
                 "--save-every-steps", "1", "--lost-rank-timeout", str(timeout)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
    deadline = time.monotonic() + 240
    while saved_step(out) < 2:
        assert time.monotonic() < deadline and workers[0].poll() is None, logs[0].read_text()[-3000:]
        time.sleep(0.05)
    workers[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    status = workers[0].wait(timeout=60)
    waited = time.monotonic() - killed
    text = logs[0].read_text()
    assert status == LOST_PEER_EXIT, text[-3000:]
    assert waited < timeout + 15, f"the survivor took {waited:.0f} s"
    assert "error: lost rank 1 of 2: no heartbeat for" in text and f"resume from {out / 'checkpoint.npz'}" in text
    stopped = saved_step(out)
    assert stopped >= 2  # the last checkpoint is intact
    translation(out, 1, "--epochs", "3", "--resume")
    assert state(out)["progress"] == {"epoch": 3, "step": 15, "partial": None}


# ---- GPT-2 ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    rng = np.random.default_rng(0)
    write_shard(root / "t_train_000000.bin", rng.integers(0, 16, 2000))
    write_shard(root / "t_val_000000.bin", rng.integers(0, 16, 500))
    return root


def gpt2(shards: Path, out: Path, processes: int, *options: str) -> str:
    model = [] if "--resume-from" in options else ["--depth", "1", "--channels", "8", "--heads", "2",
                                                    "--max-seq-len", "8", "--vocab-size", "16"]  # fmt: skip
    program = ["--train-shards", str(shards / "t_train_*.bin"), "--val-shards", str(shards / "t_val_*.bin"),
               "--batch-size", "4", "--seq-len", "8", "--steps", "4", "--val-every", "2", "--val-batches", "1",
               "--checkpoint-every", "2", "--grad-clip", "1", "--lr", "1e-2", "--out-dir", str(out), *model, *options]
    return launch(["gpt2", "--simple", "--", *program], processes)  # fmt: skip


def test_gpt2_trains_alike_on_two_processes_with_zero_1_micro_batches_and_resumes_on_one(shards, tmp_path) -> None:
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    gpt2(shards, one, 1)
    log = gpt2(shards, two, 2, "--zero", "1", "--micro-batch-size", "1")
    assert "2 processes x 2 (data parallel, ZeRO-1), micro-batches of up to 1" in log
    gpt2(shards, resumed, 1, "--resume-from", str(two / "checkpoint_000002"))
    want = read_checkpoint(one / "model.bin")[1]
    for run in (two, resumed):
        for name, value in read_checkpoint(run / "model.bin")[1].items():
            if name == "qkvb":  # [layers, 3C]: the key bias is [:, C:2C]
                value, reference = np.delete(value, np.s_[8:16], axis=1), np.delete(want[name], np.s_[8:16], axis=1)
            else:
                reference = want[name]
            assert relative(value, reference) <= TOLERANCE, f"{name} of {run.name}"
