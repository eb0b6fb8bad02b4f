"""Train GPT-2 with minitorch on llm.c token shards, starting from an llm.c checkpoint or from
GPT-2's initialisation, and leave the result as an llm.c checkpoint.

The defaults follow llm.c's ``train_gpt2_fp32.cu``: AdamW (0.9, 0.999, eps 1e-8) at a constant
3e-4 with no weight decay, batch 4 x 1024, training batches in shard order (llm.c's DataLoader
without shuffling), validation from the start of the val shards; --preset auto keeps them on CUDA
and trains a small model on a CPU (options.py). Per step one line (loss, ms, tokens/s, time left)
and a record in ``<out-dir>/metrics.jsonl`` (also the validation losses, and at the end the peak
memory); at the end ``<out-dir>/loss.png`` and ``<out-dir>/model.bin`` (float32, or with ``--dtype
bf16`` llm.c's bfloat16 version 5, as its bf16 trainer writes).

The run holds a lock on --out-dir; ``<out-dir>/checkpoint_NNNNNN/`` is saved every
--checkpoint-every steps and --checkpoint-every-minutes minutes (the newest --keep-checkpoints
kept); Ctrl-C or SIGTERM finishes the step, saves one and exits with status 0 and the command that
continues the run. Every input is checked before training (inputs.py), each problem one ``error:`` line.
--batch-size is the step's global batch, the same training on any number of processes (torchrun).

    python project/gpt2_data.py && python project/train_gpt2.py        # shards from Multi30k, then train
    python project/train_gpt2.py --init-from gpt2_124M.bin --train-shards 'fineweb_train_*.bin'
    python project/train_gpt2.py --init-from gpt2_124M_bf16.bin --dtype bf16 --train-shards 'fineweb_train_*.bin'
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer

import minitorch
from project.common.checkpoint import CheckpointError
from project.common.console import run_program
from project.common.control import GracefulStop, SaveSchedule
from project.common.eta import Estimate, Pace, first_line, format_duration, speed_of
from project.common.lock import first_process, locked_out_dir
from project.common.metrics import MetricsLog
from project.common.options import InputError, backend_from_option
from project.common.parallel import DataParallel, check_divisible
from project.common.precision import compute_precision
from project.common.schedule import learning_rate
from project.gpt2.data import EOT_TOKEN
from project.gpt2.inputs import Inputs, open_inputs
from project.gpt2.llmc import LlmcFormatError, num_parameters
from project.gpt2.model import GPT2
from project.gpt2.options import parse_args, resume_command
from project.gpt2.sample import generate
from project.gpt2.training import (
    LLMC_DTYPES, STATE_MODEL, GPT2Step, QueuedStep, checkpoint_directory, load_training_state, plot_losses,
    prune_checkpoints, save_training_state, validation_loss,
)  # fmt: skip

METRICS_NAME = "metrics.jsonl"
PLOT_NAME = "loss.png"
INPUT_ERRORS = (InputError, CheckpointError, LlmcFormatError)


def sample(model: GPT2, args: argparse.Namespace, tokenizer: Optional[Tokenizer], seed: int) -> str:
    """One sample as text (or token ids without a tokenizer), following --prompt."""
    if tokenizer is None:
        prompt_ids = [args.eot_id]
    else:
        eot = tokenizer.token_to_id(EOT_TOKEN)
        prompt_ids = ([] if eot is None else [eot]) + tokenizer.encode(args.prompt, add_special_tokens=False).ids
    ids = generate(model, prompt_ids, args.sample_tokens, args.temperature, args.top_k, seed)
    new = ids[len(prompt_ids) :]
    return args.prompt + tokenizer.decode(new) if tokenizer else " ".join(map(str, new))


def build_model(args: argparse.Namespace, inputs: Inputs, backend: minitorch.TensorBackend) -> GPT2:
    options = dict(
        backend=backend, use_fused_kernel=args.use_fused_kernel, attention=args.attention,
        activation=args.activation, recompute_layers=args.recompute_layers,
    )  # fmt: skip
    if inputs.start is not None:
        return GPT2.from_checkpoint(inputs.start, **options)
    return GPT2.fresh(inputs.config, seed=args.seed, **options)


def due_points(first: int, last: int, every: int, from_one: bool = False) -> int:
    """How many of the steps first..last hold an evaluation done every `every` steps and after the
    last (none when every is 0; from_one: never at step 0)."""
    if not every:
        return 0
    first = max(first, 1) if from_one else first
    return (last // every - (first - 1) // every) + (last % every != 0) if first <= last else 0


def plan(
    args: argparse.Namespace, inputs: Inputs, backend: minitorch.TensorBackend, rows: int, step: int, total: int
) -> Estimate:
    """The planned time of steps step..total on one process that runs `rows` sequences of a step
    (and of a validation batch): training steps, validations and samples."""
    speed, params, tokens = speed_of(backend), num_parameters(inputs.config), rows * args.seq_len
    validation = args.val_batches * speed.forward(params, tokens) if inputs.val else 0.0
    one_sample = args.sample_tokens * speed.forward(params, min(args.sample_tokens, inputs.config.max_seq_len))
    other = due_points(step, total, args.val_every) * validation + due_points(step, total, args.sample_every, True) * one_sample
    return Estimate(speed.startup_s, speed.train_step(params, tokens), total - step, other)


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run the program; returns {"args", "records" (the metric records), "model", "out_dir",
    "stopped" (the signal that stopped it, or None)} and the peak memory. Bad input exits with a
    one-line error (status 1).

    Under `torchrun --nproc_per_node N` --batch-size B stays the step's global batch: process r
    trains on the r-th B/N x T slice of every B x T sample of the shards (llm.c's multi-process
    DataLoader), in micro-batches of --micro-batch-size rows where given, each loss weighted by its
    part of the step; the gradients are summed during backward (minitorch.distributed; --zero 1
    shards AdamW's state), so the run trains as on one process. Validation losses are averaged over
    the processes, rank 0 prints and writes every file, a stop signal or a due checkpoint is acted
    on by every process at the same step, a checkpoint resumes with any N, and a lost process ends
    the others with a message instead of a hang."""
    return run_program(lambda: run(argv), INPUT_ERRORS)


def run(argv: Optional[Sequence[str]]) -> dict[str, Any]:
    """main() without turning bad input into SystemExit."""
    args = parse_args(argv)
    hint = (f"The last checkpoint in {args.out_dir} (checkpoint_NNNNNN/) is intact: continue with --resume-from "
            f"on any number of processes")  # fmt: skip
    with locked_out_dir(args.out_dir, hold=first_process()):
        # Under torchrun: joins the group, picks this process's GPU, starts the watchdog.
        with DataParallel(args.backend, vars(args), resume_hint=hint) as parallel:
            return train(args, parallel, argv)


def train(args: argparse.Namespace, parallel: DataParallel, argv: Optional[Sequence[str]]) -> dict[str, Any]:
    """Check the inputs, announce the run, train it (saving on schedule and on a stop signal) and
    write its outputs."""
    out_dir = Path(args.out_dir)
    choice = backend_from_option(args.backend)
    backend = choice.backend
    minitorch.set_float32_matmul_precision(args.matmul_precision)
    minitorch.manual_seed(args.seed)
    N, T = parallel.world_size, args.seq_len
    B = parallel.global_batch(args.batch_size)
    check_divisible(B, N)
    b = B // N  # this process's rows of a step
    inputs = open_inputs(args, parallel.rank, N, rows=b)
    train, val = inputs.train, inputs.val
    total_steps = args.steps or train.batches_per_epoch
    start = f"{'resuming' if args.resume_from else 'new run'} in {out_dir}"
    step = 0
    model = build_model(args, inputs, backend)
    micro = parallel.micro_slices(b)
    parallel.wrap(model, micro_batches=len(micro) > 1)
    optimizer = parallel.optimizer(
        model, lr=args.lr, weight_decay=args.weight_decay, eps=1e-8, max_grad_norm=args.grad_clip or None
    )
    if args.resume_from:
        step = load_training_state(args.resume_from, model, optimizer, train)["step"]
    estimate = plan(args, inputs, backend, b, step, total_steps)
    steps = f"{total_steps:,} steps of {B}x{T} tokens" + (f", {step:,} done" if step else "")
    parallel.print(first_line(choice, start, args.preset, args.auto_preset, num_parameters(inputs.config), steps,
                              estimate.total_s, resumed=bool(step)), flush=True)  # fmt: skip
    train_step = GPT2Step(model, optimizer, args.loss, parallel.gradient_sync, args.cuda_graphs and backend.cuda,
                          args.dtype, micro_slices=micro, weight=b / B)  # fmt: skip
    parallel.before_close(train_step.release_graphs)  # a graph may hold the step's all-reduces
    peak_lr = parallel.peak_lr(args.lr)
    precision = compute_precision(args.dtype)
    metrics = MetricsLog(out_dir / METRICS_NAME, write=parallel.is_main)
    records = metrics.restart((lambda r: r["step"] <= step) if args.resume_from else None)
    val_batches = min(args.val_batches, val.batches_per_epoch) if val else 0
    split = f", {N} processes x {b} (data parallel{', ZeRO-1' if args.zero else ''})" if N > 1 else ""
    split += f", micro-batches of up to {args.micro_batch_size}" if len(micro) > 1 else ""
    parallel.print(
        f"GPT-2 {model.config}{split}: {model.attention_config}, loss {args.loss}, recompute layers "
        f"{args.recompute_layers}, matmul precision {args.matmul_precision}, dtype {args.dtype}; {train.num_tokens:,} training tokens in "
        f"{len(train.paths)} shard(s) ({train.batches_per_epoch} steps of {B}x{T}), validation: "
        + (f"{val_batches} batches every {args.val_every} steps" if val and args.val_every else "none"),
        flush=True,
    )
    schedule = SaveSchedule(args.checkpoint_every, args.checkpoint_every_minutes)
    pace, first_step = Pace(), step

    def log(record: dict) -> None:
        records.append(record)
        metrics.append(record)

    def save() -> Path:
        directory = checkpoint_directory(out_dir, step)
        optimizer_state = parallel.optimizer_state(optimizer)  # under --zero 1 every process gathers
        if parallel.is_main:
            save_training_state(directory, model, optimizer_state, step, train, vars(args))
            prune_checkpoints(out_dir, args.keep_checkpoints)
        schedule.saved()
        return directory

    def result(stopped: Optional[str]) -> dict[str, Any]:
        memory = minitorch.peak_memory_mb(backend)
        if stopped is None:
            log({"step": step, **memory})
        return {"args": args, "records": records, "model": model, "out_dir": out_dir, "stopped": stopped, **memory}

    # Step i is queued before step i - 1's loss is read, so the host's work between steps (the next
    # batch, the log line) overlaps the GPU's; a step's time is from the previous step's result to its own.
    pending: Optional[tuple[int, float, QueuedStep]] = None  # (step, lr, the queued step)
    finished = time.perf_counter()

    def finish() -> None:
        """Wait for the pending step, then log and print it."""
        nonlocal pending, finished
        if pending is None:
            return
        done, lr, queued = pending
        pending = None
        loss, norm = queued.result()
        now = time.perf_counter()
        seconds, finished = now - finished, now
        loss = parallel.sum(loss)[0]  # the step's loss over all B x T tokens (each process's is weighted)
        pace.step()
        tokens_per_s = B * T / seconds
        record = {"step": done, "loss": loss, "lr": lr, "ms": seconds * 1e3, "tokens_per_s": tokens_per_s}
        if norm is not None:
            record["grad_norm"] = norm
        log(record)
        left = estimate.remaining(total_steps - done, plan(args, inputs, backend, b, done + 1, total_steps).other_s,
                                  pace.seconds_per_step)  # fmt: skip
        parallel.print(
            f"step {done:5d}/{total_steps} | loss {loss:.6f} | lr {lr:.3e} | {seconds * 1e3:8.1f} ms | "
            f"{tokens_per_s:10,.0f} tok/s" + (f" | grad norm {norm:.3f}" if norm is not None else "")
            + f" | {format_duration(left)} left",
            flush=True,
        )

    with GracefulStop() as stop:
        while True:
            last = step == total_steps
            validating = bool(val and args.val_every and (step % args.val_every == 0 or last))
            sampling = bool(args.sample_every and step > 0 and (step % args.sample_every == 0 or last))
            stopping, saving = parallel.agree(True, stop.requested, step > first_step and schedule.due(step))
            if validating or sampling or stopping or saving or last:
                finish()
            if validating:
                with precision:
                    val_loss = parallel.sum(validation_loss(model, val, val_batches, args.loss))[0] / N
                parallel.print(f"step {step:5d} | val loss {val_loss:.6f} ({N * val_batches} batches)", flush=True)
                log({"step": step, "val_loss": val_loss})
            if sampling and parallel.is_main:
                with precision:
                    text = sample(model, args, inputs.tokenizer, args.seed + step)
                print(f"step {step:5d} | sample: {text!r}", flush=True)
            if stopping or saving:
                directory = save()
                if stopping and not last:
                    signal_name = stop.requested or "another process's signal"
                    parallel.print(f"stopped by {signal_name} at step {step}/{total_steps}; saved {directory}; "
                                   f"continue with: {resume_command(argv, directory)}", flush=True)  # fmt: skip
                    return result(signal_name)
                parallel.print(f"step {step:5d} | saved {directory}", flush=True)
            if last:
                break
            if pending is None:
                finished = time.perf_counter()  # the steps' clock restarts after a pause (validation, saving)
            ids, targets = train.next_batch()
            lr = learning_rate(step, peak_lr, args.warmup_steps, total_steps, args.final_lr_frac)
            queued = train_step.queue(ids, targets, lr)
            finish()
            step += 1
            pending = (step, lr, queued)

    outcome = result(None)
    if parallel.is_main:
        model.save_checkpoint(out_dir / STATE_MODEL, LLMC_DTYPES[args.dtype])
        plot_losses(records, out_dir / PLOT_NAME, f"GPT-2 L{model.config.num_layers} C{model.config.channels}, {args.activation}")
        steady = [r["ms"] for r in records if "ms" in r][1:]
        print(
            f"done: {step} steps, median {np.median(steady) if steady else float('nan'):.1f} ms/step after the first, "
            f"peak memory {outcome['peak_memory_mb']:,.0f} MiB ({outcome['memory_kind']}); "
            f"wrote {out_dir / STATE_MODEL}, {out_dir / METRICS_NAME}, {out_dir / PLOT_NAME}",
            flush=True,
        )
    return outcome


if __name__ == "__main__":
    main()
