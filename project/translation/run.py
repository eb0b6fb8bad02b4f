"""One run of the translation program: its data (checked before training), model, optimizer and batch
order, and the pieces of its epoch loop: train (the rest of) an epoch, evaluate, checkpoint.

The checkpoint is ``<out-dir>/checkpoint.npz``, a run checkpoint (project/common/checkpoint.py, kind
"machine_translation"): the configuration and run_state (parameters, AdamW moments, batch order,
RNG states and the progress record, the running sums of an unfinished epoch included).

Data parallel (torchrun, parallel.py): every process trains its part of each step (in micro-batches
where it exceeds --micro-batch-size); the running sums of an unfinished epoch are each process's own
until the epoch ends or a checkpoint sums them, rank 0 writes the checkpoint (under --zero 1 from the
optimizer state every process gathers) and resumes with the sums, the others from zero, and a save or
a stop happens in every process at the same step (agreed every --log-every steps).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict

import numpy as np
from tqdm import tqdm

import minitorch
from project.common.checkpoint import Checkpoint, CheckpointError, restore_optimizer, save_checkpoint
from project.common.console import command_line
from project.common.control import GracefulStop, SaveSchedule
from project.common.eta import Pace, format_duration, speed_of
from project.common.schedule import learning_rate
from project.common.train_step import StepTimer
from project.translation.batches import Batcher, encode_pairs
from project.translation.checks import check_corpus, check_encoded
from project.translation.corpus import load_corpus
from project.translation.evaluate import Decoders, evaluate
from project.translation.model import build_model
from project.translation.options import CHECKPOINT_KIND, CHECKPOINT_NAME
from project.translation.parallel import TranslationParallel
from project.translation.plan import RunPlan, plan_run, position, resume_point
from project.translation.step import TranslationStep
from project.translation.tokenizer import encode_prompts, load_or_train_tokenizer


def prepare_data(config: Dict[str, Any], out_dir: Path) -> Dict[str, Any]:
    """Corpus (never downloaded unless --download), its checks, tokenizer, encoded splits, test prompts."""
    corpus = load_corpus(config["data_dir"], download=config["download"])
    check_corpus(corpus, config)
    tokenizer = load_or_train_tokenizer(out_dir, corpus.train, config["vocab_size"])
    train = encode_pairs(tokenizer, corpus.train, config["max_len"])
    valid = encode_pairs(tokenizer, corpus.valid[: config["valid_samples"]], config["max_len"])
    check_encoded(train, valid, config)
    test_pairs = corpus.test[: config["test_samples"]]
    sources = [de for de, _ in test_pairs]
    prompts = encode_prompts(tokenizer, sources, config["max_len"])
    return {"tokenizer": tokenizer, "train": train, "valid": valid, "sources": sources,
            "references": [en for _, en in test_pairs], "prompts": prompts}  # fmt: skip


class TranslationRun:
    """A run's model, optimizer, batch order and progress: trains epochs, evaluates, checkpoints.

    progress: {"epoch": last finished epoch, "step": updates so far, "partial": None between epochs,
    else the unfinished epoch's running sums and whether its training part is done}."""

    def __init__(
        self,
        config: Dict[str, Any],
        backend: minitorch.TensorBackend,
        data: Dict[str, Any],
        parallel: TranslationParallel,
    ):
        self.config, self.backend, self.data, self.parallel = config, backend, data, parallel
        self.out_dir = Path(config["out_dir"])
        self.model = build_model(config, data["tokenizer"].get_vocab_size(), backend)
        self.batcher = Batcher(data["train"].sequences, config["batch_size"], seed=config["seed"],
                               samples_per_epoch=config["samples_per_epoch"])  # fmt: skip
        rows = parallel.process_rows(config["batch_size"])
        parallel.wrap(self.model, micro_batches=len(parallel.micro_slices(rows)) > 1)
        self.optimizer = parallel.optimizer(self.model, lr=config["lr"], weight_decay=config["weight_decay"],
                                            max_grad_norm=config["grad_clip"] or None)  # fmt: skip
        # The schedule's clock counts batches (a step advances it by parallel.batches_per_step): any N resumes.
        self.total_batches = config["epochs"] * len(self.batcher)
        self.peak_lr = parallel.peak_lr(config["lr"])
        self.progress: Dict[str, Any] = {"epoch": 0, "step": 0, "partial": None}
        self.schedule = SaveSchedule(config["save_every_steps"], config["save_every_minutes"])
        self.step = TranslationStep(
            self.model, self.optimizer, backend, config["loss"], use_graphs=config["cuda_graphs"] and backend.cuda,
            label_smoothing=config["label_smoothing"], gradient_sync=parallel.gradient_sync, dtype=config["dtype"],
        )
        self.timer = StepTimer(backend)
        self.pace = Pace()
        self.decoders = Decoders(self.model, config, backend)
        self.plan = self._plan()

    def _plan(self) -> RunPlan:
        """The plan of what is left, from the data's sizes and the model (exact now, where the first
        line had to estimate them before the corpus was read)."""
        sizes = {"train": len(self.data["train"].sequences), "valid": len(self.data["valid"].sequences),
                 "test": len(self.data["prompts"])}  # fmt: skip
        params = sum(p.value.numel() for p in self.model.parameters())
        state = {"progress": self.progress, "batcher": self.batcher.state_dict()}
        return plan_run(self.config, speed_of(self.backend), self.parallel, sizes, params, state)

    def position(self) -> str:
        """Where the run stands, as the progress bar counts ("epoch 2/10, step 17/227")."""
        state = {"progress": self.progress, "batcher": self.batcher.state_dict()}
        epoch, step, _ = resume_point(state, self.parallel.batches_per_step, self.plan.per_epoch)
        return position(epoch, self.config["epochs"], step, self.plan.per_epoch)

    def save(self) -> None:
        """Checkpoint now (the device loss sum of an unfinished epoch is read into the progress and,
        in a data-parallel run, summed over the processes, all of which call this together; under
        --zero 1 they also gather the optimizer's moments)."""
        partial, progress = self.progress["partial"], self.progress
        if partial is not None and not partial["trained"]:
            partial["loss_sum"] = self.step.loss_total()
            loss_sum, n_targets = self.parallel.sum(partial["loss_sum"], partial["n_targets"])
            progress = {**progress, "partial": {**partial, "loss_sum": loss_sum, "n_targets": int(n_targets)}}
        optimizer_state = self.parallel.optimizer_state(self.optimizer)
        if self.parallel.is_main:
            save_checkpoint(self.out_dir / CHECKPOINT_NAME, CHECKPOINT_KIND, self.config,
                            run_state(self.model, optimizer_state, self.batcher, progress))  # fmt: skip
        self.schedule.saved()

    def resumed(self, progress: Dict[str, Any]) -> None:
        """Continue from a checkpoint's progress record: rank 0 carries its running sums, the other
        processes start theirs from zero."""
        partial = progress["partial"]
        if not self.parallel.is_main and partial is not None and not partial["trained"]:
            progress = {**progress, "partial": {**partial, "loss_sum": 0.0, "n_targets": 0}}
        self.progress = progress
        self.plan = self._plan()

    def train_epoch(self, epoch: int, stop: GracefulStop) -> bool:
        """Train (the rest of) an epoch; False when a stop signal ended it (after a save)."""
        partial, config, parallel = self.progress["partial"], self.config, self.parallel
        done = self.batcher.state_dict()["batches_done"]
        steps = parallel.steps(self.batcher)  # a resumed epoch skips the batches it had done
        bar = tqdm(steps, total=parallel.steps_per_epoch(self.batcher), desc=f"epoch {epoch}/{config['epochs']}",
                   unit="step", initial=done // parallel.batches_per_step, disable=not parallel.is_main)  # fmt: skip
        self.step.reset_loss(partial["loss_sum"])
        start, before = time.perf_counter(), partial["train_seconds"]
        self.timer.start()
        for i, shard in enumerate(bar):
            clock = (epoch - 1) * len(self.batcher) + shard.first_batch
            lr = learning_rate(clock, self.peak_lr, config["warmup_steps"], self.total_batches)
            micro = shard.micro_batches(parallel.micro_slices(len(shard.sequences)))
            replayed = self.step.accumulate(micro, lr, capture=shard.full)
            self.timer.mark(shard.step_tokens, steady=replayed or not self.step.use_graphs)
            self.pace.step()
            self.progress["step"] += 1
            partial["lr"] = lr
            partial["n_targets"] += shard.n_targets
            partial["n_tokens"] += shard.step_tokens
            partial["train_seconds"] = before + time.perf_counter() - start
            log = (i + 1) % config["log_every"] == 0
            if log and parallel.is_main:
                left = self.plan.remaining(epoch, done // parallel.batches_per_step + i + 1, self.pace.seconds_per_step)
                bar.set_postfix(loss=f"{self.step.loss_total() / partial['n_targets']:.3f}", lr=f"{lr:.2e}",
                                tok_s=f"{partial['n_tokens'] / partial['train_seconds']:,.0f}",
                                run_left=format_duration(left), refresh=False)  # fmt: skip
            stopping, saving = parallel.agree(log, stop.requested, self.schedule.due(self.progress["step"]))
            if stopping or saving:
                self.save()
                if stopping:
                    bar.close()
                    return False
        bar.close()
        self.pace.pause()
        loss_sum, n_targets = parallel.sum(self.step.loss_total(), partial["n_targets"])
        partial["loss_sum"], partial["n_targets"] = loss_sum, int(n_targets)
        partial["train_seconds"] = before + time.perf_counter() - start
        partial["trained"] = True
        return True

    def evaluate(self, epoch: int) -> Dict[str, Any]:
        """Validation loss, translations of the test sentences (greedy, or beam search with
        config["beam_size"] > 1) and BLEU: the epoch's record."""
        partial, start = self.progress["partial"], time.perf_counter()
        translations = self.out_dir / f"translations_epoch{epoch}.txt"
        valid_loss, decoded = evaluate(self.decoders, self.data, {"epoch": (self.config["beam_size"], translations)})
        eval_seconds = time.perf_counter() - start
        return {
            "epoch": epoch, "step": self.progress["step"], "lr": partial["lr"],
            "train_loss": partial["loss_sum"] / partial["n_targets"], "valid_loss": valid_loss,
            "bleu": decoded["epoch"].bleu, "tokens": partial["n_tokens"],
            "tokens_per_s": partial["n_tokens"] / partial["train_seconds"], "train_seconds": partial["train_seconds"],
            "tokens_per_s_median_step": self.timer.median_tokens_per_s(), "graphs_captured": self.step.captured,
            "eval_seconds": eval_seconds, "seconds": partial["train_seconds"] + eval_seconds,
            **minitorch.peak_memory_mb(self.backend), "sample": decoded["epoch"].hypotheses[0],
        }  # fmt: skip

    def stopped(self, signal_name: str) -> str:
        """The line printed when a signal stopped the run: where, what was saved, how to go on."""
        where = self.position()
        command = command_line(Path(__file__).parents[1] / "run_machine_translation.py", "--resume", "--out-dir",
                               str(self.out_dir))  # fmt: skip
        return f"stopped by {signal_name} in {where}; saved {self.out_dir / CHECKPOINT_NAME}; continue with: {command}"


def run_state(
    model: minitorch.DecoderLM, optimizer_state: Dict[str, Any], batcher: Batcher, progress: Dict[str, Any]
) -> Dict[str, Any]:
    """Everything a checkpoint needs to continue a run exactly: parameters, the optimizer's state_dict
    (step count, moments), the batch order (mid-epoch included), the generators behind dropout and
    numpy's global one, and the caller's progress record (epoch, step, the running sums of an
    unfinished epoch)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer_state,
        "batcher": batcher.state_dict(),
        "rng": {"minitorch": minitorch.get_rng_state(), "numpy": np.random.get_state(legacy=False)},
        "progress": progress,
    }


def restore_run_state(
    checkpoint: Checkpoint, model: minitorch.DecoderLM, optimizer: minitorch.Adam, batcher: Batcher
) -> Dict[str, Any]:
    """Load what run_state saved into a freshly built model, optimizer and batcher; returns the
    progress record. A state that does not fit them raises CheckpointError naming the file."""
    state = checkpoint.state
    try:
        model.load_state_dict(state["model"])
        restore_optimizer(checkpoint.path, optimizer, state["optimizer"], model, list(state["model"]))
        batcher.load_state_dict(state["batcher"])
        minitorch.set_rng_state(state["rng"]["minitorch"])
        np.random.set_state(state["rng"]["numpy"])
        return dict(state["progress"])
    except CheckpointError:
        raise
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise CheckpointError(f"{checkpoint.path} does not fit this run: {type(err).__name__}: {err}") from None
