"""The programs' data parallelism on the CPU (gloo): both programs' own training code on tiny models on
SimpleOps (no numba compilation in each process), through scripts/ddp_programs.py under torchrun.

- the same global batch trains the same model on 1 and 2 processes, also in micro-batches and with
  ZeRO-1 (whose gathered AdamW state equals plain AdamW's);
- a checkpoint written by 2 processes (ZeRO-1) resumes in 1, and one written by 1 process in 2;
- two "nodes", each started as its own torchrun command (c10d rendezvous), train as one node of 2;
- SIGKILL of one of two processes ends the other within the lost-rank timeout, exit status
  LOST_PEER_EXIT, with a message naming the lost rank; the last checkpoint is intact and resumes.

One parameter is left out of the comparisons of runs on different numbers of processes: the key part
of the attention's qkv bias (ddp_programs.differences says why).
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from minitorch.distributed import LOST_PEER_EXIT
from project.gpt2.llmc import read_checkpoint, write_shard

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from ddp_programs import (  # noqa: E402 (a script's module)
    checkpoint_of, differences, finish, free_port, kill_one, saved_step, start, start_nodes,
)

TOLERANCE = 1e-5  # largest |difference| / largest |value| of a tensor


def launch(args, processes: int = 1) -> str:
    return finish(start(args, processes))


def translation(out: Path, processes: int = 1, *options: str) -> Path:
    launch(["translation", "--simple", "--out", str(out), *options], processes)
    return out


def state(out: Path) -> dict:
    return checkpoint_of(out).state


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def assert_same_training(got: Path, want: Path, context: str, exact: bool = False) -> None:
    """Equal progress; parameters and AdamW moments equal within TOLERANCE (exact: bit for bit)."""
    found = differences(got, want, exact, TOLERANCE)
    assert not found, f"{context}: {found}"


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
    assert state(runs["one"])["progress"] == {"epoch": 2, "step": 10, "partial": None}
    for name in ("one_micro", "two", "two_zero_micro"):
        assert_same_training(runs[name], runs["one"], f"{name} against one process")


def test_zero_1_trains_as_plain_data_parallel(runs) -> None:
    """Two processes each way (one of them in micro-batches): parameters and the gathered moments agree
    to rounding."""
    assert_same_training(runs["two_zero_micro"], runs["two"], "ZeRO-1 against all-reduce")


@pytest.mark.parametrize("first, then", [((2, "--zero", "1"), (1,)), ((1,), (2, "--zero", "1"))],
                         ids=["2 ZeRO-1 -> 1", "1 -> 2 ZeRO-1"])  # fmt: skip
def test_a_checkpoint_resumes_on_another_number_of_processes(runs, tmp_path, first, then) -> None:
    """Stopped mid-epoch (step 3 of 5) and resumed: the same data order and the same model."""
    out = tmp_path / "run"
    translation(out, first[0], *first[1:], "--stop-at-step", "3")
    assert state(out)["progress"]["step"] == 3 and state(out)["progress"]["partial"]["epoch"] == 1
    translation(out, then[0], *then[1:], "--resume")
    assert_same_training(out, runs["one"], f"processes {first[0]} then {then[0]}")


def test_two_nodes_launched_apart_train_as_one_node(runs, tmp_path) -> None:
    """torchrun --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d, one command per "node"."""
    out = tmp_path / "run"
    finish(*start_nodes(["translation", "--simple", "--out", str(out)], free_port()))
    assert_same_training(out, runs["two"], "two nodes against one", exact=True)


def test_a_killed_process_ends_the_other_with_a_message_and_the_run_resumes(tmp_path) -> None:
    out, timeout = tmp_path / "run", 5.0
    args = ["translation", "--simple", "--out", str(out), "--epochs", "3", "--save-every-steps", "1",
            "--lost-rank-timeout", str(timeout)]  # fmt: skip
    status, waited, log = kill_one(args, free_port(), out, tmp_path)
    assert status == LOST_PEER_EXIT, log[-3000:]
    assert waited < timeout + 15, f"the survivor took {waited:.0f} s"
    assert "error: lost rank 1 of 2: no heartbeat for" in log and f"resume from {out / 'checkpoint.npz'}" in log
    assert saved_step(out) >= 2  # the last checkpoint is intact
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
    # --preset full: the parser's defaults (auto would pick tiny on a CPU, whose samples start at GPT-2's <|endoftext|>).
    program = ["--preset", "full", "--train-shards", str(shards / "t_train_*.bin"),
               "--val-shards", str(shards / "t_val_*.bin"),
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
