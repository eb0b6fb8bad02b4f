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
(the options: options.py).

    python project/run_machine_translation.py                      # CUDA when available, else CPU
    python project/run_machine_translation.py --preset tiny        # a few minutes on a laptop CPU
    python project/run_machine_translation.py --out-dir runs/mt --resume
    torchrun --nproc_per_node 2 project/run_machine_translation.py      # data parallel, 2 GPUs
    python -m project.translation --preset tiny                    # the same program

Under torchrun each process trains on its own batch of every step (parallel.py) and the
gradients are combined by minitorch.distributed; rank 0 alone evaluates, prints and writes the
outputs, and a checkpoint resumes with any number of processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

import minitorch
from project.common.checkpoint import CheckpointError
from project.common.control import GracefulStop, StopRequested
from project.common.metrics import MetricsLog
from project.common.options import InputError, backend_from_option
from project.translation.average import save_snapshot
from project.translation.corpus import CorpusError, MissingDataError
from project.translation.evaluate import FINAL_NAME, final_evaluation
from project.translation.options import CHECKPOINT_NAME, resolve_config
from project.translation.parallel import TranslationParallel
from project.translation.plot import plot_metrics
from project.translation.run import TranslationRun, prepare_data, restore_run_state

METRICS_NAME = "metrics.jsonl"


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the program; returns {"config", "history" (one metrics record per epoch), "out_dir",
    "stopped" (the signal that stopped it, or None), "final" (the final evaluation's record, None
    when stopped or when no epoch was trained)}. Bad input exits with a one-line error."""
    try:
        return run(argv)
    except (InputError, CheckpointError, MissingDataError, CorpusError) as err:
        raise SystemExit(f"error: {err}") from None


def run(argv: Optional[Sequence[str]]) -> Dict[str, Any]:
    """main() without turning bad input into SystemExit."""
    config, checkpoint = resolve_config(argv)
    parallel = TranslationParallel(config["backend"])  # under torchrun: joins the group, picks this process's GPU
    say = parallel.print
    choice = backend_from_option(config["backend"])
    backend = choice.backend
    out_dir = Path(config["out_dir"])
    say(f"{choice}; {'resuming' if checkpoint else 'new run'} in {out_dir}", flush=True)
    minitorch.set_float32_matmul_precision(config["matmul_precision"])
    minitorch.manual_seed(config["seed"])
    np.random.seed(config["seed"])
    out_dir.mkdir(parents=True, exist_ok=True)
    with parallel.main_first():  # rank 0 trains and saves the tokenizer, the others load it
        data = prepare_data(config, out_dir)
    job = TranslationRun(config, backend, data, parallel)
    if checkpoint is not None:
        job.resumed(restore_run_state(checkpoint, job.model, job.optimizer, job.batcher))
    parallel.decorrelate_rng()
    metrics = MetricsLog(out_dir / METRICS_NAME, write=parallel.is_main)
    history = metrics.restart(lambda r: r["epoch"] <= job.progress["epoch"])

    n_params = sum(p.value.numel() for p in job.model.parameters())
    say(
        f"{'resuming at epoch ' + str(job.progress['epoch']) + ' step ' + str(job.progress['step']) if checkpoint else 'training'} "
        f"({job.model.attention_config}, loss: {config['loss']}, recompute layers: {config['recompute_layers']}): "
        f"{n_params:,} parameters, "
        f"vocab {data['tokenizer'].get_vocab_size()}, {len(data['train'].sequences)} train pairs "
        f"({data['train'].n_dropped} longer than {config['max_len']} dropped), {len(data['valid'].sequences)} valid, "
        f"{len(data['prompts'])} test; {parallel.steps_per_epoch(job.batcher)} steps/epoch"
        f"{f' on {parallel.world_size} processes' if parallel.world_size > 1 else ''}",
        flush=True,
    )

    def finish(stopped: Optional[str], final: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        job.step.release_graphs()  # before leaving the group: a graph may hold its all-reduces
        parallel.close()
        return {"config": config, "history": history, "out_dir": out_dir, "stopped": stopped, "final": final}

    with GracefulStop() as stop:
        for epoch in range(job.progress["epoch"] + 1, config["epochs"] + 1):
            if job.progress["partial"] is None:
                job.progress["partial"] = {"epoch": epoch, "trained": False, "lr": None, "loss_sum": 0.0,
                                           "n_targets": 0, "n_tokens": 0, "train_seconds": 0.0}  # fmt: skip
            record = None
            trained = job.progress["partial"]["trained"] or job.train_epoch(epoch, stop)
            if trained and parallel.is_main:  # rank 0 alone evaluates, writes and prints
                try:
                    with stop.interruptible():
                        record = job.evaluate(epoch)
                except StopRequested:
                    job.save()
            # Every process learns whether rank 0 was stopped while evaluating.
            if not trained or parallel.sum(float(parallel.is_main and record is None))[0]:
                say(job.stopped(stop.requested or "another process's signal"), flush=True)
                return finish(stop.requested)
            job.progress = {"epoch": epoch, "step": job.progress["step"], "partial": None}
            if not parallel.is_main:
                continue
            sample = record.pop("sample")
            metrics.append(record)
            plot_metrics(metrics.path)
            history.append(record)
            if config["average_last"] > 1:
                save_snapshot(out_dir, epoch, job.model.state_dict(), keep=config["average_last"])
            job.save()
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
