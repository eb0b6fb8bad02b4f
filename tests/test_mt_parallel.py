"""The translation program's data-parallel batches: every batch of an epoch trained once, by one
process, with loss shares that make a step equal one process on all its batches."""

import json

import numpy as np
import pytest
from test_mt_data import numbered_sequences

import minitorch
from project.common.options import InputError
from project.common.parallel import check_divisible
from project.translation import batches as mt_batches
from project.translation import tokenizer as mt_tokenizer
from project.translation.parallel import TranslationParallel, shard_steps
from project.translation.step import TranslationStep


def identities(batch: mt_batches.Batch) -> tuple:
    return tuple(sorted((batch.tokens[:, 0] - 3).tolist()))


def sharded_epoch(batchers, world_size):
    """Each rank's steps of one epoch, from its own Batcher (as each process draws its own)."""
    return [list(shard_steps(b, rank, world_size)) for rank, b in enumerate(batchers)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_every_batch_of_the_epoch_goes_to_exactly_one_rank(world_size) -> None:
    sequences = numbered_sequences(103)  # 13 batches: 13 = 2 * 5 + 3 leaves a short last step
    plain = [identities(batch) for batch in mt_batches.Batcher(sequences, 8, seed=7).epoch()]
    ranks = sharded_epoch([mt_batches.Batcher(sequences, 8, seed=7) for _ in range(world_size)], world_size)
    assert len({len(steps) for steps in ranks}) == 1
    trained = []
    for parts in zip(*ranks):
        assert sum(p.share for p in parts) == pytest.approx(1.0)
        assert len({p.first_batch for p in parts}) == 1 and parts[0].first_batch == len(trained)
        assert len({p.step_tokens for p in parts}) == 1
        real = [p for p in parts if p.n_targets > 0]  # the others: stand-ins, the step's first batch
        assert real == list(parts[: len(real)]) and all(p.share == 0 for p in parts[len(real) :])
        assert parts[0].step_tokens == sum(int((p.batch.tokens != mt_tokenizer.PAD_ID).sum()) for p in real)
        for p in parts:
            assert p.share == pytest.approx(p.n_targets / sum(q.n_targets for q in real))
        trained.extend(identities(p.batch) for p in real)
        lengths = [sorted((p.batch.tokens != mt_tokenizer.PAD_ID).sum(axis=1).tolist()) for p in real]
        assert all(a[-1] <= b[0] for a, b in zip(lengths, lengths[1:]))  # neighbours in length
    assert sorted(trained) == sorted(plain)
    if world_size == 1:
        assert trained == plain


def test_a_checkpoint_resumes_with_another_number_of_processes() -> None:
    sequences = numbered_sequences(103)
    drawn = mt_batches.Batcher(sequences, 8, seed=7).epoch_groups(2)
    plain = [identities(mt_batches.make_batch([sequences[i] for i in b])) for group in drawn for b in group]
    two = [mt_batches.Batcher(sequences, 8, seed=7) for _ in range(2)]
    iterators = [shard_steps(b, rank, 2) for rank, b in enumerate(two)]
    steps = [[next(it) for _ in range(2)] for it in iterators]
    head = [identities(s.batch) for pair in zip(*steps) for s in pair if s.n_targets > 0]
    states = [json.loads(json.dumps(b.state_dict())) for b in two]
    assert states[0] == states[1] and states[0]["batches_done"] == len(head)

    three = [mt_batches.Batcher(sequences, 8, seed=99) for _ in range(3)]
    for b in three:
        b.load_state_dict(states[0])
    tail = sharded_epoch(three, 3)
    assert tail[0][0].first_batch == len(head)
    rest = [identities(s.batch) for step in zip(*tail) for s in step if s.n_targets > 0]
    assert head + rest == plain  # the epoch finishes in the order drawn for 2 processes


def test_rank_must_be_in_the_group() -> None:
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        next(shard_steps(mt_batches.Batcher(numbered_sequences(10), 4), 2, 2))


def test_a_stand_in_step_changes_nothing_and_counts_no_loss() -> None:
    """share 0 and no counted targets: zero gradients (AdamW without decay leaves the parameters),
    nothing added to the loss sum; share 1 is the plain step."""
    fast = minitorch.TensorBackend(minitorch.FastOps)
    minitorch.manual_seed(5)
    model = minitorch.DecoderLM(n_vocab=40, n_embd=16, n_head=2, n_positions=16, n_layers=1, p_dropout=0.0, backend=fast)
    step = TranslationStep(model, minitorch.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0), fast, "naive", use_graphs=False)
    batch = mt_batches.make_batch(numbered_sequences(4)[1:])
    before = [p.value.to_numpy() for p in model.parameters()]
    step(batch, lr=1e-2, share=0.0, n_targets=0)
    assert step.loss_total() == 0.0
    for p, old in zip(model.parameters(), before):
        assert not p.value.grad.to_numpy().any()
        np.testing.assert_array_equal(p.value.to_numpy(), old)
    step(batch, lr=1e-2)
    assert step.loss_total() > 0.0


def test_one_process_acts_on_its_own_flags_every_step(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    parallel = TranslationParallel("cpu")
    assert (parallel.rank, parallel.world_size, parallel.gradient_sync) == (0, 1, None)
    assert parallel.agree(False, "SIGTERM", False) == (True, False)
    assert parallel.agree(True, None, True) == (False, True)
    assert parallel.sum(2.5, 3) == [2.5, 3.0]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_global_batch_is_split_over_the_processes_row_by_row(world_size) -> None:
    """The default: each step is one batch of the epoch, whatever the number of processes; process r
    takes rows r, r + N, ... (so all get rows of about the same lengths), micro-batches cut those."""
    sequences = numbered_sequences(103)  # batches of 8, the last of 7
    plain = [identities(batch) for batch in mt_batches.Batcher(sequences, 8, seed=7).epoch()]
    ranks = [list(shard_steps(mt_batches.Batcher(sequences, 8, seed=7), rank, world_size, split_batches=True))
             for rank in range(world_size)]  # fmt: skip
    assert [len(steps) for steps in ranks] == [len(plain)] * world_size
    for batch, parts in zip(plain, zip(*ranks)):
        assert sum(p.share for p in parts) == pytest.approx(1.0)
        assert [p.full for p in parts] == [len(batch) == 8] * world_size  # the short batch: not worth a graph
        assert tuple(sorted(i for p in parts for i in identities(p.batch))) == batch
        widths = [p.batch.tokens.shape[1] for p in parts]
        assert max(widths) - min(widths) <= 1  # neighbours in length
        for p in parts:
            rows = len(p.sequences)
            micro = p.micro_batches([slice(0, 1), slice(1, rows)])
            assert sum(m.n_targets for m in micro) == p.n_targets and [len(m.batch.tokens) for m in micro] == [1, rows - 1]
            assert sum(m.share for m in micro) == pytest.approx(p.share)


def test_the_options_of_a_step_split(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    parallel = TranslationParallel("cpu", {"micro_batch_size": 3})
    assert (parallel.process_rows(8), parallel.micro_slices(8), parallel.global_batch(8)) == (
        8, [slice(0, 3), slice(3, 6), slice(6, 8)], 8)  # fmt: skip
    scaled = TranslationParallel("cpu", {"scale_batch_with_world": True, "lr_scaling": "sqrt"})
    assert (scaled.batches_per_step, scaled.peak_lr(0.1), scaled.micro_slices(5)) == (1, 0.1, [slice(0, 5)])
    with pytest.raises(InputError, match="--batch-size 6 .* does not split evenly over 4 processes"):
        check_divisible(6, 4)
