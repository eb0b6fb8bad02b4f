"""Train minitorch's DecoderLM to translate German to English on Multi30k, and evaluate it.

Each pair is one sequence ``de <eos_de> en <eos_en>``; the loss covers the English side only.
Per epoch: training with a progress bar (loss, tokens/s), validation loss, batched decoding of
the test set (greedy, or beam search with --beam-size), BLEU (sacrebleu, cased, detokenized), one
JSON line appended to ``<out-dir>/metrics.jsonl`` and ``<out-dir>/translations_epoch{N}.txt``. At
the end, a final evaluation (of the mean parameters of the last --average-last epochs) reports
greedy and beam-search BLEU in ``<out-dir>/final.json``.

``<out-dir>/checkpoint.npz`` (project/common/checkpoint.py: minitorch.save's .npz, never a pickle; the
one before is kept as checkpoint.prev.npz) is written at each epoch's end, every --save-every-steps steps and
every --save-every-minutes minutes; Ctrl-C or SIGTERM finishes the step, saves and exits. ``--resume``
continues from it exactly, mid-epoch included. Every input is checked before training starts
(the options: options.py), each problem one ``error:`` line; the run holds a lock on --out-dir; its
first line announces the backend, preset, model size, steps and estimated time (plan.py).

    python project/run_machine_translation.py                      # full on CUDA, --preset tiny on a CPU
    python project/run_machine_translation.py --preset tiny        # a few minutes on a laptop CPU
    python project/run_machine_translation.py --out-dir runs/mt --resume
    torchrun --nproc_per_node 2 project/run_machine_translation.py      # data parallel, 2 GPUs
    python -m project.translation --preset tiny                    # the same program

Under torchrun --batch-size stays the global batch: each process trains on its part of every step
(parallel.py; --micro-batch-size splits a part that does not fit), the gradients are combined by
minitorch.distributed (--zero 1 shards AdamW's state), so the run trains as on one process; rank 0
alone evaluates, prints and writes the outputs, a checkpoint resumes with any number of processes,
and a lost process ends the others with a message instead of a hang.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import minitorch
from project.common.checkpoint import Checkpoint, CheckpointError
from project.common.console import run_program
from project.common.control import GracefulStop, StopRequested
from project.common.eta import speed_of
from project.common.lock import first_process, locked_out_dir
from project.common.metrics import MetricsLog
from project.common.options import InputError, backend_from_option
from project.translation.average import save_snapshot
from project.translation.corpus import CorpusError, MissingDataError
from project.translation.evaluate import FINAL_NAME, final_evaluation
from project.translation.options import CHECKPOINT_NAME, parse, resolve_config
from project.translation.parallel import TranslationParallel
from project.translation.plan import announce
from project.translation.plot import plot_metrics
from project.translation.run import TranslationRun, prepare_data, restore_run_state

METRICS_NAME = "metrics.jsonl"
INPUT_ERRORS = (InputError, CheckpointError, MissingDataError, CorpusError)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the program; returns {"config", "history" (one metrics record per epoch), "out_dir",
    "stopped" (the signal that stopped it, or None), "final" (the final evaluation's record, None
    when stopped or when no epoch was trained)}. Bad input exits with a one-line error (status 1);
    --out-dir is locked for the run (a second run into it is refused, naming this one's PID)."""
    return run_program(lambda: run(argv), INPUT_ERRORS)


def run(argv: Optional[Sequence[str]]) -> Dict[str, Any]:
    """main() without turning bad input into SystemExit."""
    args, explicit = parse(argv)
    with locked_out_dir(args["out_dir"], hold=first_process()):
        config, checkpoint = resolve_config(args, explicit)
        out_dir = Path(config["out_dir"])
        hint = (f"The last checkpoint, {out_dir / CHECKPOINT_NAME}, is intact: continue with --resume --out-dir "
                f"{out_dir} on any number of processes")  # fmt: skip
        # Under torchrun: joins the group, picks this process's GPU, starts the watchdog.
        with TranslationParallel(config["backend"], config, resume_hint=hint) as parallel:
            return train(config, checkpoint, parallel, auto_preset=explicit.get("preset", "auto") == "auto")


def train(
    config: Dict[str, Any], checkpoint: Optional[Checkpoint], parallel: TranslationParallel, auto_preset: bool
) -> Dict[str, Any]:
    """run() in the process group, on a configuration resolved and checked: data, model, the
    epochs, the final evaluation."""
    out_dir = Path(config["out_dir"])
    say = parallel.print
    choice = backend_from_option(config["backend"])
    backend = choice.backend
    say(announce(choice, config, checkpoint, speed_of(backend), parallel, auto_preset), flush=True)
    minitorch.set_float32_matmul_precision(config["matmul_precision"])
    minitorch.manual_seed(config["seed"])
    np.random.seed(config["seed"])
    out_dir.mkdir(parents=True, exist_ok=True)
    with parallel.main_first():  # rank 0 trains and saves the tokenizer, the others load it
        data = prepare_data(config, out_dir)
    job = TranslationRun(config, backend, data, parallel)
    parallel.before_close(job.step.release_graphs)  # a graph may hold the step's all-reduces
    if checkpoint is not None:
        job.resumed(restore_run_state(checkpoint, job.model, job.optimizer, job.batcher))
    parallel.decorrelate_rng()
    metrics = MetricsLog(out_dir / METRICS_NAME, write=parallel.is_main)
    history = metrics.restart(lambda r: r["epoch"] <= job.progress["epoch"])

    n_params = sum(p.value.numel() for p in job.model.parameters())
    say(
        f"{'resuming in ' + job.position() if checkpoint else 'training'} "
        f"({job.model.attention_config}, loss: {config['loss']}, recompute layers: {config['recompute_layers']}, "
        f"dtype: {config['dtype']}): "
        f"{n_params:,} parameters, "
        f"vocab {data['tokenizer'].get_vocab_size()}, {len(data['train'].sequences)} train pairs "
        f"({data['train'].n_dropped} longer than {config['max_len']} dropped), {len(data['valid'].sequences)} valid "
        f"({data['valid'].n_dropped} dropped), {len(data['prompts'])} test; {job.plan.per_epoch} steps/epoch of "
        f"{parallel.global_batch(config['batch_size'])} pairs{_split(parallel, config)}",
        flush=True,
    )

    def finish(stopped: Optional[str], final: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return {"config": config, "history": history, "out_dir": out_dir, "stopped": stopped, "final": final}

    with GracefulStop() as stop:
        for epoch in range(job.progress["epoch"] + 1, config["epochs"] + 1):
            if job.progress["partial"] is None:
                job.progress["partial"] = {"epoch": epoch, "trained": False, "lr": None, "loss_sum": 0.0,
                                           "n_targets": 0, "n_tokens": 0, "train_seconds": 0.0}  # fmt: skip
            record = None
            if not (job.progress["partial"]["trained"] or job.train_epoch(epoch, stop)):
                say(job.stopped(stop.requested or "another process's signal"), flush=True)
                return finish(stop.requested)
            if parallel.is_main:  # rank 0 alone evaluates, writes and prints
                try:
                    with stop.interruptible():
                        record = job.evaluate(epoch)
                except StopRequested:
                    pass
            parallel.barrier("evaluated")  # the others wait for rank 0's evaluation, however long
            # Every process learns whether rank 0 was stopped while evaluating.
            if parallel.sum(float(parallel.is_main and record is None))[0]:
                job.save()
                say(job.stopped(stop.requested or "another process's signal"), flush=True)
                return finish(stop.requested)
            job.progress = {"epoch": epoch, "step": job.progress["step"], "partial": None}
            if parallel.is_main:
                sample = record.pop("sample")
                metrics.append(record)
                plot_metrics(metrics.path)
                history.append(record)
                if config["average_last"] > 1:
                    save_snapshot(out_dir, epoch, job.model.state_dict(), keep=config["average_last"])
            parallel.barrier("recorded")
            job.save()  # every process: under --zero 1 the optimizer's moments are gathered from all
            if parallel.is_main:
                print(
                    f"epoch {epoch}: train loss {record['train_loss']:.4f}, valid loss {record['valid_loss']:.4f}, "
                    f"BLEU {record['bleu']:.2f}, {record['tokens_per_s']:,.0f} tokens/s over the epoch (median step "
                    f"{_rate(record)}), {record['seconds']:.1f}s, peak memory {record['peak_memory_mb']:,.0f} MiB "
                    f"({record['memory_kind']}); sample: {sample!r}",
                    flush=True,
                )
    if not parallel.is_main:
        return finish(None)
    print_summary(history, out_dir)
    final = None
    if history:
        final = final_evaluation(job.model, config, data, backend, history[-1]["epoch"], job.decoders)
    return finish(None, final)


def _split(parallel: TranslationParallel, config: Dict[str, Any]) -> str:
    """How a step's pairs are split: over processes (and ZeRO-1), into micro-batches."""
    rows = parallel.process_rows(config["batch_size"])
    parts = [f" on {parallel.world_size} processes ({rows} pairs each{', ZeRO-1' if config['zero'] else ''})"
             if parallel.world_size > 1 else ""]  # fmt: skip
    micro = len(parallel.micro_slices(rows))
    if micro > 1:
        parts.append(f", {micro} micro-batches of up to {config['micro_batch_size']}")
    return "".join(parts)


def _rate(record: Dict[str, Any]) -> str:
    rate = record.get("tokens_per_s_median_step")
    return "n/a" if rate is None else f"{rate:,.0f} tokens/s"


def print_summary(history: List[Dict[str, Any]], out_dir: Path) -> None:
    if not history:
        print(f"no epochs trained; outputs in {out_dir}")
        return
    last = history[-1]
    best_bleu = max(history, key=lambda r: r["bleu"])
    best_valid = min(history, key=lambda r: r["valid_loss"])
    train_seconds = sum(r["train_seconds"] for r in history)
    print(
        f"done: {last['epoch']} epochs, {last['step']} steps, {sum(r['seconds'] for r in history):.1f}s "
        f"({train_seconds:.1f}s training, {sum(r['tokens'] for r in history) / train_seconds:,.0f} tokens/s)\n"
        f"  final BLEU {last['bleu']:.2f}, valid loss {last['valid_loss']:.4f}\n"
        f"  best BLEU {best_bleu['bleu']:.2f} (epoch {best_bleu['epoch']}), "
        f"best valid loss {best_valid['valid_loss']:.4f} (epoch {best_valid['epoch']})\n"
        f"  peak memory {max(r['peak_memory_mb'] for r in history):,.0f} MiB ({last['memory_kind']})\n"
        f"  outputs in {out_dir}: {METRICS_NAME}, translations_epoch*.txt, {CHECKPOINT_NAME}, tokenizer, {FINAL_NAME}",
        flush=True,
    )


if __name__ == "__main__":
    main()
