"""Data-parallel training: grad-ready hooks in backward, the process group's setup errors, and
DistributedDataParallel, in one process (a gloo group of one) and in two (torchrun, pure-Python
backend, compared with one process training on the concatenated batches); gradient accumulation
over micro-batches, ZeRO-1 (ShardedAdamW), the overlap profile and the watchdog."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import minitorch
from minitorch import distributed
from minitorch_testing import assert_close

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from ddp_programs import free_port  # noqa: E402 (a script's module)

SIMPLE = minitorch.TensorBackend(minitorch.SimpleOps)


def leaf(values, backend=SIMPLE):
    return minitorch.tensor_from_numpy(np.asarray(values, dtype=np.float32), backend=backend).requires_grad_(True)


# ---- grad-ready hooks --------------------------------------------------------------------------
def test_leaf_hooks_run_once_with_the_whole_gradient_as_soon_as_it_is_final() -> None:
    rng = np.random.default_rng(0)
    x, w1, w2 = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((5, 2))
    X, W1, W2 = leaf(x), leaf(w1), leaf(w2)
    seen = []

    def record(name):
        def hook(t):
            seen.append((name, t.grad.to_numpy(), W1.grad is None))

        return hook

    W1.register_grad_ready_hook(record("W1"))
    W2.register_grad_ready_hook(record("W2"))
    # W1 is used twice (the matmul and the square), so its hook waits for both contributions.
    ((X @ W1).relu() @ W2).sum().__add__((W1 * W1).sum()).backward()

    tx, t1, t2 = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w1, w2))
    ((tx @ t1).relu() @ t2).sum().add((t1 * t1).sum()).backward()
    assert [name for name, _, _ in seen] == ["W2", "W1"]
    assert seen[0][2], "W2's gradient must be ready while W1's is still being computed"
    assert_close(seen[0][1], t2.grad.numpy(), "dW2")
    assert_close(seen[1][1], t1.grad.numpy(), "dW1")
    assert_close(X.grad.to_numpy(), tx.grad.numpy(), "dX")


def test_hooks_belong_on_leaves_and_can_be_removed() -> None:
    a = leaf([1.0, 2.0])
    calls = []

    def hook(t):
        calls.append(1)

    a.register_grad_ready_hook(hook)
    (a * a).sum().backward()
    a.remove_grad_ready_hook(hook)
    (a * a).sum().backward()
    assert calls == [1]
    with pytest.raises(ValueError, match="not a grad-ready hook"):
        a.remove_grad_ready_hook(hook)
    with pytest.raises(RuntimeError, match="leaf"):
        (a * 2.0).register_grad_ready_hook(hook)


def test_parameter_hooks_follow_the_value_that_update_sets() -> None:
    p = minitorch.Parameter(leaf([1.0, 2.0]))
    calls = []
    p.register_grad_ready_hook(lambda t: calls.append(t.unique_id))
    p.update(leaf([3.0, 4.0]))
    (p.value * p.value).sum().backward()
    assert calls == [p.value.unique_id]


def test_map_scalar_writes_into_out(backend) -> None:
    a = minitorch.tensor_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), backend=backend)
    out = minitorch.zeros((2, 3), backend=backend)
    result = backend.mul_scalar(a._tensor.permute(1, 0), 0.5, out=out._tensor.permute(1, 0))
    assert result is not None
    assert_close(out.to_numpy(), np.arange(6).reshape(2, 3) * 0.5, "mul_scalar out")


# ---- setup errors ------------------------------------------------------------------------------
@pytest.fixture
def torchrun_env(monkeypatch):
    for name in distributed.TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_init_names_the_missing_variables(torchrun_env) -> None:
    torchrun_env.setenv("RANK", "0")
    torchrun_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(distributed.DistributedSetupError, match="LOCAL_RANK, MASTER_ADDR, MASTER_PORT.*torchrun"):
        distributed.init_process_group("cpu")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"RANK": "one"}, "RANK='one' is not an integer"),
        ({"RANK": "2"}, "0 <= RANK < WORLD_SIZE"),
    ],
)
def test_init_rejects_bad_values(torchrun_env, values, message) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in {**env, **values}.items():
        torchrun_env.setenv(name, value)
    with pytest.raises(distributed.DistributedSetupError, match=message):
        distributed.init_process_group("cpu")


def test_init_rejects_unknown_device_and_missing_gpu(torchrun_env) -> None:
    with pytest.raises(distributed.DistributedSetupError, match="'tpu'"):
        distributed.init_from_torchrun("tpu")
    if torch.cuda.is_available():
        return
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in env.items():
        torchrun_env.setenv(name, value)
    with pytest.raises(distributed.DistributedSetupError, match=r"'cuda' \(NCCL\).*torch.cuda.is_available"):
        distributed.init_process_group("cuda")


def test_without_torchrun_a_program_is_rank_0_of_1(torchrun_env) -> None:
    info = distributed.init_from_torchrun("cpu")
    assert (info.rank, info.world_size, info.is_main) == (0, 1, True)
    assert distributed.all_reduce_sum([1.5, 2.0]) == [1.5, 2.0]
    with pytest.raises(distributed.DistributedSetupError, match="init_process_group"):
        distributed.DistributedDataParallel(minitorch.Linear(2, 2, backend=SIMPLE))


# ---- DistributedDataParallel in a group of one -------------------------------------------------
@pytest.fixture
def group_of_one(torchrun_env):
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    for name, value in env.items():
        torchrun_env.setenv(name, value)
    info = distributed.init_from_torchrun("cpu")
    yield info
    distributed.destroy_process_group()


class TwoLayers(minitorch.Module):
    def __init__(self, unused: bool = False):
        super().__init__()
        minitorch.manual_seed(5)
        self.first = minitorch.Linear(3, 4, backend=SIMPLE)
        self.second = minitorch.Linear(4, 2, backend=SIMPLE)
        if unused:
            self.spare = minitorch.Linear(2, 2, backend=SIMPLE)

    def forward(self, x):
        return self.second(self.first(x).relu())


def loss_of(model, seed=0):
    x = minitorch.tensor_from_numpy(np.random.default_rng(seed).standard_normal((5, 3)).astype(np.float32), backend=SIMPLE)
    return (model(x) * model(x)).sum()


def grads(model):
    return {name: p.value.grad.to_numpy() for name, p in model.named_parameters()}


def test_gradients_are_weighted_views_of_the_buckets_after_backward(group_of_one) -> None:
    plain = TwoLayers()
    loss_of(plain).backward()
    model = TwoLayers()
    ddp = distributed.DistributedDataParallel(model, bucket_cap_mb=40 / 2**20)
    assert ddp.bucket_sizes == [2 + 8, 4, 12]  # reversed parameter order, 10 floats a bucket
    ddp.gradient_weight = 0.25
    loss_of(model).backward()  # overlap mode: reduced when backward finishes the last bucket
    for name, g in grads(model).items():
        assert_close(g, 0.25 * grads(plain)[name], name)
    buffers = [b.storage for b in ddp._buckets]
    for p in model.parameters():
        assert any(np.shares_memory(p.value.grad._tensor._storage, b) for b in buffers)
    ddp.sync_gradients()  # nothing left to do
    assert_close(grads(model)["second.weight"], 0.25 * grads(plain)["second.weight"], "after sync")
    with pytest.raises(ValueError, match="gradient_weight"):
        ddp.gradient_weight = -1.0


def test_missing_gradients_count_as_zeros_and_are_caught(group_of_one) -> None:
    model = TwoLayers(unused=True)
    ddp = distributed.DistributedDataParallel(model)
    loss_of(model).backward()
    assert model.spare.weight.value.grad is None  # the round waits for spare
    ddp.sync_gradients()
    assert not grads(model)["spare.weight"].any()
    loss_of(model).backward()
    with pytest.raises(RuntimeError, match=r"second gradient.*\['spare.weight', 'spare.bias'\]"):
        loss_of(model).backward()


def test_no_sync_accumulates_and_the_next_backward_reduces_the_sum(group_of_one) -> None:
    plain = TwoLayers()
    for seed in range(3):
        loss_of(plain, seed).backward()
    model = TwoLayers()
    ddp = distributed.DistributedDataParallel(model)
    with ddp.no_sync():
        loss_of(model, 0).backward()
        loss_of(model, 1).backward()
    loss_of(model, 2).backward()
    for name, g in grads(model).items():
        assert_close(g, grads(plain)[name], name)


def test_phase_mode_leaves_backward_alone_until_sync_gradients(group_of_one) -> None:
    model = TwoLayers()
    ddp = distributed.DistributedDataParallel(model, overlap=False)
    loss_of(model).backward()
    local = grads(model)
    ddp.gradient_weight = 0.5
    ddp.sync_gradients()
    for name, g in grads(model).items():
        assert_close(g, 0.5 * local[name], name)
    ddp.close()


# ---- two processes -----------------------------------------------------------------------------
def test_two_processes_equal_one_process_on_the_concatenated_batches(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    script = str(ROOT / "scripts" / "ddp_check.py")
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           script, "--backend", "simple", "--out", str(tmp_path)]  # fmt: skip
    workers = subprocess.run(run, env=env, capture_output=True, text=True, timeout=240)
    assert workers.returncode == 0, workers.stdout + workers.stderr
    check = subprocess.run([sys.executable, script, "--backend", "simple", "--out", str(tmp_path), "--compare", "2"],
                           env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ranks identical" in check.stdout


# ---- micro-batches, ZeRO-1, the overlap profile, the watchdog (one process) -----------------------
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "phase"])
def test_accumulator_sums_the_micro_batches_in_its_buckets(torchrun_env, overlap) -> None:
    """Without a process group: rounds that keep their sums leave .grad None; the last hands out
    the weighted sum of all (what a step of several micro-batches on one process needs)."""
    plain = TwoLayers()
    for seed in range(3):
        loss_of(plain, seed).backward()
    model = TwoLayers()
    acc = distributed.GradientAccumulator(model, overlap=overlap)
    assert acc.gradient_weight == 1.0 and not distributed.is_initialized()
    for seed in range(3):
        model.first.weight.value.grad = None
        with acc.backward_round(accumulate=seed > 0, reduce=seed == 2):
            loss_of(model, seed).backward()
        if seed < 2:
            assert all(p.value.grad is None for p in model.parameters())
    for name, g in grads(model).items():
        assert_close(g, grads(plain)[name], name)


def test_sharded_adamw_equals_adamw_and_saves_the_same_state(group_of_one) -> None:
    """A group of one (every bucket one shard): the weights move into the buckets, the update and its
    global-norm clip equal AdamW's, and state_dict is AdamW's, per parameter.  (Shards of several
    processes: scripts/ddp_check.py, tests/test_parallel_programs.py.)"""
    hyper = dict(lr=0.05, weight_decay=0.1, max_grad_norm=0.5)
    plain = TwoLayers()
    reference = minitorch.AdamW(plain.parameters(), **hyper)
    model = TwoLayers()
    ddp = distributed.DistributedDataParallel(model, bucket_cap_mb=40 / 2**20, shard=True)
    ddp.gradient_weight = 1.0
    with pytest.raises(ValueError, match="shard=True"):
        distributed.ShardedAdamW(distributed.DistributedDataParallel(TwoLayers()))
    optimizer = distributed.ShardedAdamW(ddp, **hyper)
    assert ddp.bucket_sizes == [2 + 8, 4, 12] and optimizer.state_floats == 2 * 26
    buffers = [b.values for b in ddp._buckets]
    for p in model.parameters():
        assert any(np.shares_memory(p.value._tensor._storage, b) for b in buffers)
    for seed in range(3):
        for m, opt in ((plain, reference), (model, optimizer)):
            opt.zero_grad()
            loss_of(m, seed).backward()
            opt.step()
        assert_close(optimizer.grad_norm().to_numpy(), reference.grad_norm().to_numpy(), "norm")
    for name, p in model.named_parameters():
        assert_close(p.value.to_numpy(), dict(plain.named_parameters())[name].value.to_numpy(), name)
    got, want = optimizer.state_dict(), reference.state_dict()
    assert got["t"] == want["t"] == 3
    for moment in ("m", "v"):
        for i, value in want[moment].items():
            assert_close(got[moment][i], value, f"{moment}[{i}]")
    fresh = distributed.ShardedAdamW(ddp, **hyper)
    fresh.load_state_dict({"t": 3, "m": {str(i): v for i, v in want["m"].items()}, "v": want["v"]})
    assert_close(fresh.state_dict()["v"][0], want["v"][0], "reloaded")


def test_sharded_adamw_leaves_the_working_copies_current(group_of_one) -> None:
    """Under autocast the update rewrites every bf16 working copy from the gathered weights, so
    nothing is left for the next forward to cast: a captured CUDA graph replays a cast only where the
    capture saw the copy stale, and with micro-batches that was the last micro-batch's forward."""
    model = TwoLayers()
    ddp = distributed.DistributedDataParallel(model, bucket_cap_mb=40 / 2**20, shard=True)
    ddp.gradient_weight = 1.0
    optimizer = distributed.ShardedAdamW(ddp, lr=0.05)
    for seed in range(2):
        optimizer.zero_grad()
        with minitorch.autocast(dtype=minitorch.bfloat16):
            loss = loss_of(model, seed)
        loss.backward()
        optimizer.step()
        for name, p in model.named_parameters():
            version, copy = p.value._autocast_copy
            assert version == p.value._version, f"{name}: its working copy is stale after the update"
            want = p.value.to_numpy().astype(ml_dtypes.bfloat16).astype(np.float32)
            assert np.array_equal(copy.float().to_numpy(), want), f"{name}: the copy is not the new weight in bf16"


def test_overlap_profile_reports_each_reducing_round(group_of_one) -> None:
    model = TwoLayers()
    ddp = distributed.DistributedDataParallel(model, bucket_cap_mb=40 / 2**20, profile=True)
    for seed in range(3):
        with ddp.no_sync() if seed == 1 else contextlib.nullcontext():
            loss_of(model, seed).backward()
    time.sleep(0.05)  # gloo runs the completion callbacks on its own thread
    summary = ddp.overlap_summary(skip=0)
    assert summary["rounds"] == 2 and summary["comm_ms"] >= 0 and summary["exposed_ms"] >= 0
    assert summary["hidden_share"] is None or summary["hidden_share"] <= 1.0
    with pytest.raises(RuntimeError, match="profile=True"):
        distributed.DistributedDataParallel(TwoLayers()).overlap_summary()


def test_watchdog_barriers_and_its_bounds(group_of_one) -> None:
    with pytest.raises(ValueError, match="timeout_s > interval_s > 0"):
        distributed.Watchdog(0, 1, timeout_s=1.0, interval_s=1.0)
    watchdog = distributed.start_watchdog(timeout_s=2.0, interval_s=0.1)
    assert distributed.active_watchdog() is watchdog
    with pytest.raises(RuntimeError, match="already running"):
        distributed.start_watchdog(2.0)
    time.sleep(0.3)  # a few heartbeats
    distributed.barrier("twice")
    distributed.barrier("twice")  # a barrier's generations: each call a new one
    distributed.stop_watchdog()
    assert distributed.active_watchdog() is None
