"""Train minitorch's DecoderLM to translate German to English on Multi30k, and evaluate it.

Each pair is one sequence ``de <eos_de> en <eos_en>``; the loss covers the English side only.
Per epoch: training with a progress bar (loss, tokens/s), validation loss, batched decoding of
the test set (greedy, or beam search with --beam-size), BLEU (sacrebleu, cased, detokenized), one
JSON line appended to ``<out-dir>/metrics.jsonl`` and ``<out-dir>/translations_epoch{N}.txt``. At
the end, a final evaluation (of the mean parameters of the last --average-last epochs) reports
greedy and beam-search BLEU in ``<out-dir>/final.json``.

``<out-dir>/checkpoint.npz`` (project/run_checkpoint.py: .npz + JSON, never a pickle; the one before
is kept as checkpoint.prev.npz) is written at each epoch's end, every --save-every-steps steps and
every --save-every-minutes minutes; Ctrl-C or SIGTERM finishes the step, saves and exits. ``--resume``
continues from it exactly, mid-epoch included. Every input is checked before training starts.

    python project/run_machine_translation.py                      # CUDA when available, else CPU
    python project/run_machine_translation.py --preset tiny        # a few minutes on a laptop CPU
    python project/run_machine_translation.py --out-dir runs/mt --resume
    torchrun --nproc_per_node 2 project/run_machine_translation.py      # data parallel, 2 GPUs

Under torchrun each process trains on its own batch of every step (project/mt_parallel.py) and the
gradients are combined by minitorch.distributed; rank 0 alone evaluates, prints and writes the
outputs, and a checkpoint resumes with any number of processes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import minitorch
from project.common.options import fraction, non_negative, nonnegative_int, positive_int, str2bool
from project.translation.corpus import DATA_DIR_ENV, DEFAULT_BASE_URL, DEFAULT_DATA_DIR, CorpusError, MissingDataError
from project.translation.average import save_snapshot
from project.translation.checks import InputError, check_options, option
from project.translation.evaluate import FINAL_NAME, final_evaluation
from project.translation.parallel import TranslationParallel
from project.translation.run import CHECKPOINT_KIND, CHECKPOINT_NAME, TranslationRun, prepare_data
from project.translation.model import make_backend, restore_run_state
from project.common.metrics import plot_metrics
from project.common.checkpoint import Checkpoint, CheckpointError, check_config, describe, load_checkpoint, previous_path
from project.common.control import GracefulStop, StopRequested

METRICS_NAME = "metrics.jsonl"
# Options a resumed run may change; all others are taken from the checkpoint (and must match it
# when given on the command line), since they define the model, the data or the optimization.
# --loss, --recompute-layers and --attention change how the same function is computed (memory, speed), not the model;
# the decoding and averaging options change only the evaluation.
RUN_CONTROL = {
    "epochs", "backend", "use_fused_kernel", "data_dir", "download", "eval_batch_size", "valid_samples",
    "test_samples", "out_dir", "resume", "loss", "recompute_layers", "attention", "save_every_steps",
    "save_every_minutes", "cuda_graphs", "log_every", "matmul_precision", "beam_size", "final_beam_size",
    "length_penalty", "average_last",
}  # fmt: skip
# Options newer than some checkpoints that change the training, with the value those checkpoints trained with.
TRAINED_BEFORE = {"label_smoothing": 0.0, "lr_scaling": "none"}
# --preset NAME: defaults for a quick run (explicit options still win). tiny: a 2-core CPU, minutes.
PRESETS = {
    "tiny": {
        "n_embd": 64, "n_head": 4, "n_layers": 2, "vocab_size": 1000, "max_len": 48, "batch_size": 32,
        "samples_per_epoch": 1280, "epochs": 2, "warmup_steps": 10, "lr": 3e-3, "dropout": 0.0,
        "valid_samples": 200, "test_samples": 100, "eval_batch_size": 100, "log_every": 5,
    },
}  # fmt: skip


class RenamedOption(argparse.Action):
    """The old spelling of --recompute-layers: an error that names the new one."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        parser.error(
            "--checkpoint was renamed --recompute-layers (gradient checkpointing); the saved training "
            "checkpoint always goes to --out-dir"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="German->English translation with a minitorch decoder-only transformer (Multi30k).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", choices=("none", *PRESETS), default="none",
                   help="defaults for a quick run, explicit options still win; tiny: " +
                   " ".join(f"{option(k)} {v}" for k, v in PRESETS["tiny"].items()))
    p.add_argument("--use-fused-kernel", type=str2bool, default=True, metavar="true|false",
                   help="fused attention softmax and LayerNorm (CUDA kernels on --backend cuda)")
    p.add_argument("--backend", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: CUDA when a GPU and the built kernels are present, else the CPU (numba)")
    p.add_argument("--loss", choices=("naive", "fused"), default="naive",
                   help="naive: LM-head logits + cross_entropy; fused: fused_linear_cross_entropy (no logits tensor)")
    p.add_argument("--recompute-layers", type=str2bool, default=False, metavar="true|false",
                   help="gradient checkpointing: keep only each transformer layer's input and recompute the "
                   "layer in backward")
    p.add_argument("--checkpoint", action=RenamedOption, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--matmul-precision", choices=minitorch.precision.PRECISIONS, default="highest",
                   help=minitorch.precision.PRECISION_HELP)
    p.add_argument("--cuda-graphs", type=str2bool, default=True, metavar="true|false",
                   help="replay each training and decoding step from a CUDA graph (CUDA backend; ignored on the CPU)")
    p.add_argument("--log-every", type=positive_int, default=50,
                   help="steps between progress-bar loss readings (each one waits for the GPU)")
    p.add_argument("--attention", choices=("naive", "fused"), default="naive",
                   help="naive: scores, softmax and weights as [B, H, T, T] tensors; fused: minitorch.fused_attention")
    p.add_argument("--activation", choices=("softmax", "relu"), default="softmax",
                   help="attention weights: softmax, or relu(scores) without normalization")
    p.add_argument("--data-dir", default=None,
                   help=f"corpus directory (None: ${DATA_DIR_ENV} or {DEFAULT_DATA_DIR})")
    p.add_argument("--download", action="store_true",
                   help=f"fetch missing corpus files from {DEFAULT_BASE_URL} into the cache (needs network)")
    p.add_argument("--out-dir", default="runs/mt", help="metrics, translations, tokenizer and checkpoint")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out-dir")
    p.add_argument("--save-every-steps", type=nonnegative_int, default=0,
                   help="also checkpoint every N training steps (0: only at epoch ends and by time)")
    p.add_argument("--save-every-minutes", type=float, default=10.0,
                   help="also checkpoint when this many minutes passed since the last save (0: off)")
    p.add_argument("--seed", type=int, default=0, help="seed of initialization, dropout and batch order")
    p.add_argument("--epochs", type=positive_int, default=10, help="epochs to train in all")
    p.add_argument("--batch-size", type=positive_int, default=128,
                   help="training pairs per step (under torchrun: per process, N batches a step)")
    p.add_argument("--samples-per-epoch", type=positive_int, default=None,
                   help="training pairs drawn per epoch (None: all)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of AdamW")
    p.add_argument("--lr-scaling", choices=("none", "sqrt", "linear"), default="linear",
                   help="under torchrun with N processes (a global batch of N x --batch-size) the peak lr is "
                   "--lr x 1, sqrt(N) or N")
    p.add_argument("--warmup-steps", type=int, default=200,
                   help="linear warmup, then cosine decay to 0 (counted in batches: a step of N processes counts N)")
    p.add_argument("--weight-decay", type=float, default=0.01, help="decoupled (AdamW) weight decay")
    p.add_argument("--grad-clip", type=float, default=1.0, help="global gradient-norm clip (0: off)")
    p.add_argument("--label-smoothing", type=fraction, default=0.0,
                   help="train against (1 - e) * onehot + e / vocab (the validation loss stays unsmoothed)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout probability")
    p.add_argument("--n-embd", type=positive_int, default=256, help="model width")
    p.add_argument("--n-head", type=positive_int, default=8, help="attention heads")
    p.add_argument("--n-layers", type=positive_int, default=4, help="transformer layers")
    p.add_argument("--max-len", type=positive_int, default=128,
                   help="longest sequence de <eos_de> en <eos_en> in tokens (longer pairs are dropped)")
    p.add_argument("--vocab-size", type=positive_int, default=8000, help="byte-level BPE vocabulary")
    p.add_argument("--eval-batch-size", type=positive_int, default=256, help="sequences per evaluation batch")
    p.add_argument("--valid-samples", type=positive_int, default=None,
                   help="validation loss over the first N validation pairs only (None: all)")
    p.add_argument("--test-samples", type=positive_int, default=None,
                   help="decode only the first N test sentences (None: all)")
    p.add_argument("--beam-size", type=positive_int, default=1,
                   help="per-epoch test decoding: 1 greedy, more: beam search with this many beams")
    p.add_argument("--final-beam-size", type=positive_int, default=4,
                   help="beams of the final evaluation's beam-search figure (it also reports greedy)")
    p.add_argument("--length-penalty", type=non_negative, default=1.0,
                   help="beam search ranks finished hypotheses by log-prob / length ** this")
    p.add_argument("--average-last", type=positive_int, default=1,
                   help="final evaluation of the mean parameters of the last N epochs (snapshots params_epoch*.npz)")
    return p


def parse(argv: Optional[Sequence[str]]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(every option, the options given on the command line); --preset changes the defaults."""
    parser = build_parser()
    preset = parser.parse_known_args(argv)[0].preset
    parser.set_defaults(**PRESETS.get(preset, {}))
    args = vars(parser.parse_args(argv))
    explicit_parser = build_parser()
    for action in explicit_parser._actions:
        action.default = argparse.SUPPRESS
    return args, vars(explicit_parser.parse_args(argv))


def resolve_config(argv: Optional[Sequence[str]]) -> Tuple[Dict[str, Any], Optional[Checkpoint]]:
    """(configuration, checkpoint or None). A resumed run takes its configuration from the
    checkpoint, with the RUN_CONTROL options the command line sets."""
    args, explicit = parse(argv)
    path = Path(args["out_dir"]) / CHECKPOINT_NAME
    if not args["resume"]:
        for existing in (path, previous_path(path)):
            if existing.exists():
                raise InputError(f"{existing} exists; pass --resume to continue that run or choose another --out-dir")
        return args, None
    if "preset" in explicit:
        raise InputError("--preset chooses a new run's configuration; --resume takes it from the checkpoint")
    if not path.exists() and not previous_path(path).exists():
        old = path.with_name("checkpoint.pkl")
        if old.exists():
            raise InputError(f"--resume: {old} is a pickle checkpoint of an older version, which is no longer read "
                             f"(loading a pickle can run code); start a new run")
        raise InputError(f"--resume: no checkpoint {path}; train without --resume first")
    try:
        checkpoint = load_checkpoint(path, CHECKPOINT_KIND)
    except CheckpointError as err:
        prev = previous_path(path)
        if not prev.exists():
            raise
        raise CheckpointError(f"{err}; it was refused and left as it is. The previous checkpoint {prev} is "
                              f"{describe(prev)}: to continue from it, move it to {path}") from None
    config = dict(checkpoint.config)
    parser = build_parser()
    for key in RUN_CONTROL:  # options newer than the checkpoint take their defaults
        config.setdefault(key, parser.get_default(key))
    for key, value in TRAINED_BEFORE.items():
        config.setdefault(key, value)
    check_config(checkpoint, {k: v for k, v in explicit.items() if k not in RUN_CONTROL}, option)
    config.update({key: value for key, value in explicit.items() if key in RUN_CONTROL})
    config["out_dir"] = args["out_dir"]
    return config, checkpoint


def read_metrics(path: Path, up_to_epoch: int) -> List[Dict[str, Any]]:
    """Metric records of epochs <= up_to_epoch (a crash after a record but before its checkpoint
    leaves one that the resumed run writes again)."""
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if r["epoch"] <= up_to_epoch]


def write_metrics(path: Path, records: List[Dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def append_metrics(path: Path, record: Dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


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
    check_options(config)
    parallel = TranslationParallel(config["backend"])  # under torchrun: joins the group, picks this process's GPU
    say = parallel.print
    backend, backend_line = make_backend(config["backend"])
    out_dir = Path(config["out_dir"])
    say(f"{backend_line}; {'resuming' if checkpoint else 'new run'} in {out_dir}", flush=True)
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
    metrics_path = out_dir / METRICS_NAME
    history = read_metrics(metrics_path, job.progress["epoch"])
    if parallel.is_main:
        write_metrics(metrics_path, history)

    n_params = sum(p.value.size for p in job.model.parameters())
    say(
        f"{'resuming at epoch ' + str(job.progress['epoch']) + ' step ' + str(job.progress['step']) if checkpoint else 'training'} "
        f"(fused kernels: {config['use_fused_kernel']}, loss: {config['loss']}, recompute layers: {config['recompute_layers']}, "
        f"attention: {config['attention']} {config['activation']}): {n_params:,} parameters, "
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
            append_metrics(metrics_path, record)
            plot_metrics(metrics_path)
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
