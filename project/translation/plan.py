"""The translation run's plan, announced in its first line before anything is read or trained: the
backend, the preset, the model's size, the steps and the estimated time of the whole run
(project/common/eta.py), and where a resumed run stands in the numbering its progress bar uses
("epoch 2/10, step 17/227")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import minitorch
from project.common.checkpoint import Checkpoint
from project.common.eta import Estimate, Speed, first_line
from project.translation.corpus import split_sizes
from project.translation.parallel import TranslationParallel

# Tokens of a typical Multi30k pair "de <eos_de> en <eos_en>" (BPE of 1,000 to 8,000 tokens), and the
# decoding steps of a batch of test sentences (until its longest reply ends): what the time estimate
# assumes before the corpus is encoded.
TYPICAL_PAIR_TOKENS = 32
DECODING_STEPS = 32


def parameter_count(config: Mapping[str, Any], n_vocab: int) -> int:
    """Parameters of the DecoderLM that model.build_model makes for config and a vocabulary: token
    and position embeddings, per layer two LayerNorms, the q/k/v and output projections and the
    4x feed-forward, the final LayerNorm and the LM head (all with biases)."""
    C, V = config["n_embd"], n_vocab
    layer = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    return V * C + config["max_len"] * C + config["n_layers"] * layer + 2 * C + (C * V + V)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def steps_per_epoch(config: Mapping[str, Any], n_train: int, batches_per_step: int) -> int:
    """Steps of an epoch: the batches of --samples-per-epoch pairs (all n_train by default),
    batches_per_step a step (TranslationParallel.batches_per_step)."""
    samples = min(config["samples_per_epoch"] or n_train, n_train)
    return _ceil_div(_ceil_div(samples, config["batch_size"]), batches_per_step)


def evaluation_seconds(config: Mapping[str, Any], speed: Speed, params: int, n_valid: int, n_test: int,
                       beam_size: int) -> float:  # fmt: skip
    """Planned seconds of one evaluation: the validation loss and the test sentences decoded."""
    rows = config["eval_batch_size"]
    valid = _ceil_div(min(config["valid_samples"] or n_valid, n_valid), rows) * speed.forward(params, rows * TYPICAL_PAIR_TOKENS)
    batches = _ceil_div(min(config["test_samples"] or n_test, n_test), rows)
    greedy = batches * min(config["max_len"], DECODING_STEPS) * speed.decode_step(params, rows)
    return valid + greedy * (1.0 if beam_size == 1 else 1.0 + beam_size / 2.0)  # beam search: host work per beam


@dataclass(frozen=True)
class RunPlan:
    """A run's steps and planned time: per_epoch steps in each of epochs, `done` of them before this
    process started, and the estimate of the rest (its other work: evaluation_s after every epoch
    still to train, final_s at the end)."""

    epochs: int
    per_epoch: int
    done: int
    estimate: Estimate
    evaluation_s: float
    final_s: float

    @property
    def total(self) -> int:
        return self.epochs * self.per_epoch

    def remaining(self, epoch: int, step: int, seconds_per_step: Optional[float]) -> float:
        """Seconds to go after `step` steps of epoch `epoch` (its evaluation still ahead)."""
        steps_left = self.total - (epoch - 1) * self.per_epoch - step
        other = (self.epochs - epoch + 1) * self.evaluation_s + self.final_s
        return self.estimate.remaining(steps_left, other, seconds_per_step)


def plan_run(
    config: Mapping[str, Any], speed: Speed, parallel: TranslationParallel, sizes: Mapping[str, int], params: int,
    state: Optional[Mapping[str, Any]] = None,
) -> RunPlan:  # fmt: skip
    """The plan of a run of config with `sizes` pairs per split ({"train", "valid", "test"}) and
    `params` parameters on the processes of `parallel` (a step's time: this process's rows of it),
    from the start or, with a checkpoint's state, from where it stands."""
    per_epoch = steps_per_epoch(config, sizes["train"], parallel.batches_per_step)
    done, epochs_left = 0, config["epochs"]
    if state is not None:
        epoch, in_epoch, trained = resume_point(state, parallel.batches_per_step, per_epoch)
        done = min((epoch - 1) * per_epoch + in_epoch, config["epochs"] * per_epoch)
        epochs_left = config["epochs"] - epoch + 1 - int(trained)
    rows = parallel.process_rows(config["batch_size"])
    step_s = speed.train_step(params, rows * min(config["max_len"], TYPICAL_PAIR_TOKENS))
    evaluation = evaluation_seconds(config, speed, params, sizes["valid"], sizes["test"], config["beam_size"])
    final = evaluation_seconds(config, speed, params, sizes["valid"], sizes["test"], 1) + evaluation_seconds(
        config, speed, params, 0, sizes["test"], config["final_beam_size"])  # fmt: skip
    estimate = Estimate(speed.startup_s, step_s, config["epochs"] * per_epoch - done, epochs_left * evaluation + final)
    return RunPlan(config["epochs"], per_epoch, done, estimate, evaluation, final)


def announce(
    choice: minitorch.BackendChoice, config: Dict[str, Any], checkpoint: Optional[Checkpoint], speed: Speed,
    parallel: TranslationParallel, auto_preset: bool,
) -> str:  # fmt: skip
    """The run's first line, before the corpus is read: backend, where, preset, parameters, steps
    and estimated time (of the whole run, or of what a resumed one has left, and where it stands)."""
    if checkpoint is None:
        params = parameter_count(config, config["vocab_size"])
    else:
        params = sum(int(value.size) for value in checkpoint.state["model"].values())
    start = f"{'resuming' if checkpoint else 'new run'} in {config['out_dir']}"
    sizes = split_sizes(config["data_dir"])
    if sizes is None:
        return first_line(choice, start, config["preset"], auto_preset, params, "steps and time known once the corpus is read")
    state = None if checkpoint is None else checkpoint.state
    plan = plan_run(config, speed, parallel, sizes, params, state)
    steps = f"{plan.total:,} steps ({config['epochs']} epochs of {plan.per_epoch})"
    if state is not None:
        epoch, in_epoch, _ = resume_point(state, parallel.batches_per_step, plan.per_epoch)
        steps += f", {plan.done:,} done ({position(epoch, config['epochs'], in_epoch, plan.per_epoch)})"
    return first_line(choice, start, config["preset"], auto_preset, params, steps, plan.estimate.total_s,
                      resumed=state is not None)  # fmt: skip


def resume_point(state: Mapping[str, Any], batches_per_step: int, per_epoch: int) -> Tuple[int, int, bool]:
    """(epoch, its steps done, whether its training part is done) of a checkpoint's state, in the
    numbering of the progress bar: the epoch resumed (1-based) and its steps of batches_per_step batches."""
    progress = state["progress"]
    partial = progress["partial"]
    if partial is None:
        return progress["epoch"] + 1, 0, False
    if partial["trained"]:
        return partial["epoch"], per_epoch, True
    return partial["epoch"], int(state["batcher"]["batches_done"]) // batches_per_step, False


def position(epoch: int, epochs: int, step: int, per_epoch: int) -> str:
    """Where a run stands, as its progress bar counts: "epoch 2/10, step 17/227"."""
    return f"epoch {epoch}/{epochs}, step {step}/{per_epoch}"
