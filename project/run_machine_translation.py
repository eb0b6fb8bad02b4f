"""Train minitorch's DecoderLM to translate German to English on Multi30k, and evaluate it.

Each pair is one sequence ``de <eos_de> en <eos_en>``; the loss covers the English side only.
Per epoch: training with a progress bar (loss, tokens/s), validation loss, batched greedy
decoding of the test set, BLEU (sacrebleu, cased, detokenized), one JSON line appended to
``<out-dir>/metrics.jsonl``, ``<out-dir>/translations_epoch{N}.txt`` and an atomically replaced
``<out-dir>/checkpoint.pkl``; ``--resume`` continues from that checkpoint exactly.

    python project/run_machine_translation.py --backend cuda --use-fused-kernel true
    python project/run_machine_translation.py --out-dir runs/mt --resume
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    # Run as a script: make the repository root importable (minitorch, project).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from tqdm import tqdm

import minitorch
from project import mt_data
from project.mt_decode import corpus_bleu, greedy_decode, write_translations
from project.mt_steps import StepTimer, TrainStep
from project.mt_train import (
    build_model,
    checkpoint_path,
    count_tokens,
    learning_rate,
    load_checkpoint,
    make_backend,
    peak_memory_mb,
    save_checkpoint,
    validation_loss,
)

METRICS_NAME = "metrics.jsonl"
# Options a resumed run may change; all others are taken from the checkpoint (and must match it
# when given on the command line), since they define the model, the data or the optimization.
# --loss, --recompute-layers and --attention change how the same function is computed (memory, speed), not the model.
RUN_CONTROL = {
    "epochs", "backend", "use_fused_kernel", "data_dir", "eval_batch_size", "test_samples", "out_dir", "resume",
    "loss", "recompute_layers", "attention", "cuda_graphs", "log_every", "matmul_precision",
}  # fmt: skip


def str2bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return n


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
    p.add_argument("--use-fused-kernel", type=str2bool, default=True, metavar="true|false",
                   help="fused attention softmax and LayerNorm (CUDA kernels on --backend cuda)")
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--loss", choices=("naive", "fused"), default="naive",
                   help="naive: LM-head logits + cross_entropy; fused: fused_linear_cross_entropy (no logits tensor)")
    p.add_argument("--recompute-layers", type=str2bool, default=False, metavar="true|false",
                   help="gradient checkpointing: keep only each transformer layer's input and recompute the "
                   "layer in backward")
    p.add_argument("--checkpoint", action=RenamedOption, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--matmul-precision", choices=minitorch.precision.PRECISIONS, default="highest",
                   help="CUDA float32 matmuls: highest = 3xTF32 (float32 accuracy), high = one TF32 product")
    p.add_argument("--cuda-graphs", type=str2bool, default=True, metavar="true|false",
                   help="replay each training step from a CUDA graph (CUDA backend; ignored on the CPU)")
    p.add_argument("--log-every", type=positive_int, default=50,
                   help="steps between progress-bar loss readings (each one waits for the GPU)")
    p.add_argument("--attention", choices=("naive", "fused"), default="naive",
                   help="naive: scores, softmax and weights as [B, H, T, T] tensors; fused: minitorch.fused_attention")
    p.add_argument("--activation", choices=("softmax", "relu"), default="softmax",
                   help="attention weights: softmax, or relu(scores) without normalization")
    p.add_argument("--data-dir", default=None,
                   help=f"corpus directory (default: ${mt_data.DATA_DIR_ENV} or {mt_data.DEFAULT_DATA_DIR})")
    p.add_argument("--out-dir", default="runs/mt", help="metrics, translations, tokenizer and checkpoint")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=positive_int, default=10)
    p.add_argument("--batch-size", type=positive_int, default=128)
    p.add_argument("--samples-per-epoch", type=positive_int, default=None,
                   help="training pairs drawn per epoch (default: all)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of AdamW")
    p.add_argument("--warmup-steps", type=int, default=200, help="linear warmup, then cosine decay to 0")
    p.add_argument("--weight-decay", type=float, default=0.01, help="decoupled (AdamW) weight decay")
    p.add_argument("--grad-clip", type=float, default=1.0, help="global gradient-norm clip (0: off)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--n-embd", type=positive_int, default=256)
    p.add_argument("--n-head", type=positive_int, default=8)
    p.add_argument("--n-layers", type=positive_int, default=4)
    p.add_argument("--max-len", type=positive_int, default=128,
                   help="longest sequence de <eos_de> en <eos_en> in tokens (longer pairs are dropped)")
    p.add_argument("--vocab-size", type=positive_int, default=8000, help="byte-level BPE vocabulary")
    p.add_argument("--eval-batch-size", type=positive_int, default=256)
    p.add_argument("--test-samples", type=positive_int, default=None,
                   help="decode only the first N test sentences (default: all)")
    return p


def resolve_config(argv: Optional[Sequence[str]]) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """(configuration, checkpoint or None). A resumed run takes its configuration from the
    checkpoint, with the RUN_CONTROL options the command line sets."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    out_dir = Path(args["out_dir"])
    if not args["resume"]:
        if checkpoint_path(out_dir).exists():
            raise SystemExit(
                f"error: {out_dir} already holds a checkpoint; pass --resume to continue it "
                f"or choose another --out-dir"
            )
        return args, None
    explicit_parser = build_parser()
    for action in explicit_parser._actions:
        action.default = argparse.SUPPRESS
    explicit = vars(explicit_parser.parse_args(argv))
    checkpoint = load_checkpoint(checkpoint_path(out_dir))
    config = dict(checkpoint["args"])
    if "checkpoint" in config:  # runs saved before the option was renamed
        config["recompute_layers"] = config.pop("checkpoint")
    for key in RUN_CONTROL:  # options newer than the checkpoint take their defaults
        config.setdefault(key, parser.get_default(key))
    config.setdefault("activation", "softmax")  # what checkpoints from before --activation trained
    conflicts = {
        key: (value, config[key])
        for key, value in explicit.items()
        if key not in RUN_CONTROL and value != config[key]
    }
    if conflicts:
        details = ", ".join(f"--{k.replace('_', '-')} {new} (saved: {old})" for k, (new, old) in conflicts.items())
        raise SystemExit(f"error: --resume continues the saved configuration, but the command line asks for {details}")
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
    """Run the program; returns {"config", "history" (one metrics record per epoch), "out_dir"}."""
    config, checkpoint = resolve_config(argv)
    out_dir = Path(config["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = make_backend(config["backend"])
    minitorch.set_float32_matmul_precision(config["matmul_precision"])
    minitorch.manual_seed(config["seed"])
    np.random.seed(config["seed"])

    corpus = mt_data.load_corpus(config["data_dir"])
    tokenizer = mt_data.load_or_train_tokenizer(out_dir, corpus.train, config["vocab_size"])
    train = mt_data.encode_pairs(tokenizer, corpus.train, config["max_len"])
    valid = mt_data.encode_pairs(tokenizer, corpus.valid, config["max_len"])
    test_pairs = corpus.test[: config["test_samples"]]
    sources = [de for de, _ in test_pairs]
    references = [en for _, en in test_pairs]
    prompts = mt_data.encode_prompts(tokenizer, sources, config["max_len"])

    model = build_model(config, tokenizer.get_vocab_size(), backend)
    optimizer = minitorch.AdamW(
        model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"], max_grad_norm=config["grad_clip"] or None
    )
    batcher = mt_data.Batcher(
        train.sequences, config["batch_size"], seed=config["seed"], samples_per_epoch=config["samples_per_epoch"]
    )
    total_steps = config["epochs"] * len(batcher)
    metrics_path = out_dir / METRICS_NAME
    epoch, step = 0, 0
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        batcher.load_state_dict(checkpoint["batcher"])
        minitorch.set_rng_state(checkpoint["minitorch_rng"])
        np.random.set_state(checkpoint["numpy_rng"])
        epoch, step = checkpoint["epoch"], checkpoint["step"]
    history = read_metrics(metrics_path, epoch)
    write_metrics(metrics_path, history)

    n_params = sum(p.value.size for p in model.parameters())
    print(
        f"{'resuming after epoch ' + str(epoch) if checkpoint else 'training'} on {config['backend']} "
        f"(fused kernels: {config['use_fused_kernel']}, loss: {config['loss']}, recompute layers: {config['recompute_layers']}, "
        f"attention: {config['attention']} {config['activation']}): "
        f"{n_params:,} parameters, vocab {tokenizer.get_vocab_size()}, "
        f"{len(train.sequences)} train pairs ({train.n_dropped} longer than {config['max_len']} dropped), "
        f"{len(valid.sequences)} valid, {len(prompts)} test; {len(batcher)} steps/epoch",
        flush=True,
    )
    train_step = TrainStep(
        model, optimizer, backend, config["loss"], use_graphs=config["cuda_graphs"] and backend.cuda,
        graph_batch_size=config["batch_size"],
    )  # fmt: skip
    timer = StepTimer(backend)
    for epoch in range(epoch + 1, config["epochs"] + 1):
        start = time.perf_counter()
        train_step.loss_sum.copy_(0.0)
        n_targets, n_tokens = 0, 0
        bar = tqdm(batcher.epoch(), total=len(batcher), desc=f"epoch {epoch}/{config['epochs']}", unit="batch")
        timer.start()
        for i, batch in enumerate(bar):
            lr = learning_rate(step, config["lr"], config["warmup_steps"], total_steps)
            replayed = train_step(batch, lr)
            tokens = count_tokens(batch)
            timer.mark(tokens, steady=replayed or not train_step.use_graphs)
            step += 1
            n_targets += batch.n_targets
            n_tokens += tokens
            if (i + 1) % config["log_every"] == 0:
                loss = train_step.loss_total() / n_targets
                elapsed = time.perf_counter() - start
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{n_tokens / elapsed:,.0f}", lr=f"{lr:.2e}", refresh=False)
        train_loss = train_step.loss_total() / n_targets
        bar.close()
        train_seconds = time.perf_counter() - start

        valid_loss = validation_loss(model, valid.sequences, config["eval_batch_size"], backend)
        generated = greedy_decode(model, prompts, config["max_len"], config["eval_batch_size"], backend)
        hypotheses = mt_data.decode_translations(tokenizer, generated)
        bleu = corpus_bleu(hypotheses, references)
        write_translations(out_dir / f"translations_epoch{epoch}.txt", sources, references, hypotheses)
        seconds = time.perf_counter() - start
        record = {
            "epoch": epoch,
            "step": step,
            "lr": lr,
            "train_loss": train_loss,
            "valid_loss": valid_loss,
            "bleu": bleu,
            "tokens": n_tokens,
            "tokens_per_s": n_tokens / train_seconds,
            "tokens_per_s_median_step": timer.median_tokens_per_s(),
            "graphs_captured": train_step.captured,
            "train_seconds": train_seconds,
            "eval_seconds": seconds - train_seconds,
            "seconds": seconds,
            **peak_memory_mb(backend),
        }
        append_metrics(metrics_path, record)
        history.append(record)
        save_checkpoint(
            checkpoint_path(out_dir),
            {
                "args": config,
                "epoch": epoch,
                "step": step,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "batcher": batcher.state_dict(),
                "minitorch_rng": minitorch.get_rng_state(),
                "numpy_rng": np.random.get_state(),
            },
        )
        print(
            f"epoch {epoch}: train loss {record['train_loss']:.4f}, valid loss {valid_loss:.4f}, BLEU {bleu:.2f}, "
            f"{record['tokens_per_s']:,.0f} tokens/s over the epoch (median step {_rate(record)}), {seconds:.1f}s, peak memory {record['peak_memory_mb']:,.0f} MiB "
            f"({record['memory_kind']}); sample: {hypotheses[0]!r}",
            flush=True,
        )

    print_summary(history, out_dir)
    return {"config": config, "history": history, "out_dir": out_dir}


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
        f"  outputs in {out_dir}: {METRICS_NAME}, translations_epoch*.txt, checkpoint.pkl, tokenizer",
        flush=True,
    )


if __name__ == "__main__":
    main()
