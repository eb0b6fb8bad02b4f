"""Train GPT-2 with minitorch on llm.c token shards, starting from an llm.c checkpoint or from
GPT-2's initialisation, and leave the result as an llm.c checkpoint.

The defaults follow llm.c's ``train_gpt2_fp32.cu``: AdamW (0.9, 0.999, eps 1e-8) at a constant
3e-4 with no weight decay, batch 4 x 1024, training batches in shard order (llm.c's DataLoader
without shuffling), validation from the start of the val shards. Per step one line (loss, ms,
tokens/s) and a record in ``<out-dir>/metrics.jsonl`` (also the validation losses, and at the end
the peak memory); at the end ``<out-dir>/loss.png`` and ``<out-dir>/model.bin``.

    python project/gpt2_data.py --out-dir runs/gpt2_data
    python project/train_gpt2.py --depth 4 --channels 256 --heads 4 --max-seq-len 256 --vocab-size 8192 \\
        --train-shards 'runs/gpt2_data/train_en_train_*.bin' --val-shards 'runs/gpt2_data/train_en_val_*.bin' \\
        --seq-len 256 --batch-size 16 --steps 500 --lr 1e-3 --warmup-steps 50 --final-lr-frac 0.1
    python project/train_gpt2.py --init-from gpt2_124M.bin --train-shards 'fineweb_train_*.bin'
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer

import minitorch
from project.common.metrics import MetricsLog
from project.common.options import (
    NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE_INT, UNIT_INTERVAL, InputError, add_compute_options, backend_from_option,
    given_options, option,
)  # fmt: skip
from project.common.parallel import DataParallel
from project.common.schedule import learning_rate
from project.gpt2.data import EOT_TOKEN
from project.gpt2.llmc import GPT2Config
from project.gpt2.model import GPT2
from project.gpt2.sample import generate
from project.gpt2.shards import ShardLoader
from project.gpt2.training import STATE_MODEL, GPT2Step, load_training_state, plot_losses, save_training_state, validation_loss

FRESH_MODEL = ("depth", "channels", "heads", "max_seq_len", "vocab_size")
METRICS_NAME = "metrics.jsonl"
PLOT_NAME = "loss.png"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Train GPT-2 with minitorch on llm.c token shards; reads and writes llm.c checkpoints.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = p.add_argument_group("model (a fresh one with GPT-2's initialisation unless --init-from/--resume-from)")
    model.add_argument("--init-from", default=None, metavar="FILE.bin", help="llm.c float32 checkpoint to start from")
    model.add_argument("--resume-from", default=None, metavar="DIR",
                       help="checkpoint directory of an earlier run (--checkpoint-every): model, AdamW moments, "
                       "step and data position; the other options come from this command line")
    model.add_argument("--depth", type=POSITIVE_INT, default=12, help="layers of a fresh model")
    model.add_argument("--channels", type=POSITIVE_INT, default=768, help="width C of a fresh model")
    model.add_argument("--heads", type=POSITIVE_INT, default=12, help="attention heads of a fresh model")
    model.add_argument("--max-seq-len", type=POSITIVE_INT, default=1024, help="positions of a fresh model")
    model.add_argument("--vocab-size", type=POSITIVE_INT, default=50257,
                       help="vocabulary V of a fresh model (the table is padded to a multiple of 128)")
    data = p.add_argument_group("data")
    data.add_argument("--train-shards", required=True, metavar="GLOB", help="llm.c token shards to train on")
    data.add_argument("--val-shards", default=None, metavar="GLOB", help="llm.c token shards for validation")
    data.add_argument("--batch-size", type=POSITIVE_INT, default=4)
    data.add_argument("--seq-len", type=POSITIVE_INT, default=1024)
    opt = p.add_argument_group("optimization")
    opt.add_argument("--steps", type=POSITIVE_INT, default=None,
                     help="updates to run (default: one pass over the training shards, as llm.c)")
    opt.add_argument("--lr", type=NON_NEGATIVE, default=3e-4, help="peak learning rate of AdamW")
    opt.add_argument("--weight-decay", type=NON_NEGATIVE, default=0.0,
                     help="AdamW's decoupled weight decay, on every parameter as in llm.c's fp32 trainer")
    opt.add_argument("--warmup-steps", type=NON_NEGATIVE_INT, default=0, help="linear warm-up, then cosine decay")
    opt.add_argument("--final-lr-frac", type=UNIT_INTERVAL, default=1.0,
                     help="the cosine decays to lr * this at the last step (1: constant, llm.c's default)")
    opt.add_argument("--grad-clip", type=NON_NEGATIVE, default=0.0, help="global gradient-norm clip (0: off, as llm.c fp32)")
    run = p.add_argument_group("evaluation, samples, checkpoints")
    run.add_argument("--val-every", type=NON_NEGATIVE_INT, default=20,
                     help="validation loss every N steps and after the last (0: never)")
    run.add_argument("--val-batches", type=POSITIVE_INT, default=20, help="batches per validation")
    run.add_argument("--sample-every", type=NON_NEGATIVE_INT, default=0,
                     help="print a sample every N steps and after the last (0: never)")
    run.add_argument("--sample-tokens", type=POSITIVE_INT, default=64, help="tokens per sample")
    run.add_argument("--prompt", default="", help="text the samples continue (after <|endoftext|>)")
    run.add_argument("--top-k", type=POSITIVE_INT, default=None, help="sample among the k likeliest tokens")
    run.add_argument("--temperature", type=NON_NEGATIVE, default=1.0, help="sampling temperature (0: greedy)")
    run.add_argument("--tokenizer", default=None, metavar="FILE.json",
                     help="tokenizers JSON for the prompt and samples (default: the one *_tokenizer.json beside "
                     "the training shards if there is exactly one; without any, samples are token ids after "
                     "--eot-id)")
    run.add_argument("--eot-id", type=NON_NEGATIVE_INT, default=50256,
                     help="token that starts samples when there is no tokenizer (GPT-2's <|endoftext|>)")
    run.add_argument("--checkpoint-every", type=NON_NEGATIVE_INT, default=0,
                     help="save <out-dir>/checkpoint_NNNNNN/ (model.bin, state.npz) every N steps")
    add_compute_options(p, attention="fused", loss="fused")
    p.add_argument("--out-dir", default="runs/gpt2", help="metrics, plot, checkpoints and the final model.bin")
    p.add_argument("--seed", type=int, default=0, help="initialisation of a fresh model and sampling")
    return p


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The options (each within the bound of its type), after refusing combinations that would
    silently ignore one of them."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = given_options(build_parser(), argv)
    if args.init_from and args.resume_from:
        parser.error("--init-from and --resume-from both name the starting model; pass one")
    fresh = [option(name) for name in FRESH_MODEL if name in given]
    if fresh and (args.init_from or args.resume_from):
        parser.error(f"{' '.join(fresh)} describe a fresh model; the model of --init-from/--resume-from has its own")
    return args


def find_tokenizer(args: argparse.Namespace, loader: ShardLoader) -> Optional[Tokenizer]:
    """--tokenizer, or the single *_tokenizer.json that project/gpt2_data.py left beside the shards."""
    if args.tokenizer:
        return Tokenizer.from_file(args.tokenizer)
    found = sorted({p for shard in loader.paths for p in shard.parent.glob("*_tokenizer.json")})
    return Tokenizer.from_file(str(found[0])) if len(found) == 1 else None


def sample(model: GPT2, args: argparse.Namespace, tokenizer: Optional[Tokenizer], seed: int) -> str:
    """One sample as text (or token ids without a tokenizer), following --prompt."""
    if tokenizer is None:
        prompt_ids = [args.eot_id]
    else:
        eot = tokenizer.token_to_id(EOT_TOKEN)
        prompt_ids = ([] if eot is None else [eot]) + tokenizer.encode(args.prompt, add_special_tokens=False).ids
    if not prompt_ids:
        raise ValueError(f"the tokenizer has no {EOT_TOKEN!r} token; give a non-empty --prompt")
    ids = generate(model, prompt_ids, args.sample_tokens, args.temperature, args.top_k, seed)
    new = ids[len(prompt_ids) :]
    return args.prompt + tokenizer.decode(new) if tokenizer else " ".join(map(str, new))


def build_model(args: argparse.Namespace, backend: minitorch.TensorBackend) -> GPT2:
    options = dict(
        backend=backend, use_fused_kernel=args.use_fused_kernel, attention=args.attention,
        activation=args.activation, recompute_layers=args.recompute_layers,
    )  # fmt: skip
    start = args.init_from or (args.resume_from and str(Path(args.resume_from) / STATE_MODEL))
    if start:
        return GPT2.from_checkpoint(start, **options)
    config = GPT2Config.with_padded_vocab(
        max_seq_len=args.max_seq_len, vocab_size=args.vocab_size, num_layers=args.depth,
        num_heads=args.heads, channels=args.channels,
    )  # fmt: skip
    return GPT2.fresh(config, seed=args.seed, **options)


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run the program; returns {"args", "records" (the metric records), "model", "out_dir"}.

    Under `torchrun --nproc_per_node N` process r trains on the r-th B x T slice of every N x B x T
    sample of the shards (llm.c's multi-process DataLoader), the gradients are averaged during
    backward (minitorch.distributed), validation losses are averaged over the processes, and rank 0
    prints and writes every file; a checkpoint resumes with any N."""
    args = parse_args(argv)
    parallel = DataParallel(args.backend)  # under torchrun: joins the group, picks this process's GPU
    try:
        return _run(args, parallel)
    finally:
        parallel.close()


def _run(args: argparse.Namespace, parallel: DataParallel) -> dict[str, Any]:
    out_dir = Path(args.out_dir)
    if parallel.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    try:
        choice = backend_from_option(args.backend)
    except InputError as err:
        raise SystemExit(f"error: {err}") from None
    backend = choice.backend
    minitorch.set_float32_matmul_precision(args.matmul_precision)
    minitorch.manual_seed(args.seed)
    B, T, N = args.batch_size, args.seq_len, parallel.world_size
    train = ShardLoader(args.train_shards, B, T, parallel.rank, N)
    val = ShardLoader(args.val_shards, B, T, parallel.rank, N) if args.val_shards else None
    model = build_model(args, backend)
    if T > model.config.max_seq_len:
        raise SystemExit(f"error: --seq-len {T} exceeds the model's max_seq_len {model.config.max_seq_len}")
    parallel.wrap(model)
    optimizer = minitorch.AdamW(
        model.parameters(), lr=args.lr, weight_decay=args.weight_decay, eps=1e-8, max_grad_norm=args.grad_clip or None
    )
    train_step = GPT2Step(model, optimizer, args.loss, parallel.gradient_sync, args.cuda_graphs and backend.cuda)
    total_steps = args.steps or train.batches_per_epoch
    step = load_training_state(args.resume_from, optimizer, train)["step"] if args.resume_from else 0
    metrics = MetricsLog(out_dir / METRICS_NAME, write=parallel.is_main)
    records = metrics.restart((lambda r: r["step"] <= step) if args.resume_from else None)
    tokenizer = find_tokenizer(args, train)
    val_batches = min(args.val_batches, val.batches_per_epoch) if val else 0
    n_params = sum(p.value.numel() for p in model.parameters())
    parallel.print(
        f"GPT-2 {model.config} ({n_params:,} parameters), {choice}"
        + (f", {N} processes (data parallel)" if N > 1 else "")
        + f": {model.attention_config}, loss {args.loss}, recompute layers {args.recompute_layers}, "
        f"matmul precision {args.matmul_precision}; "
        f"{train.num_tokens:,} training tokens in {len(train.paths)} shard(s) ({train.batches_per_epoch} steps of "
        f"{N}x{B}x{T}), {total_steps} steps" + (f" from step {step}" if step else ""),
        flush=True,
    )

    def log(record: dict) -> None:
        records.append(record)
        metrics.append(record)

    while True:
        last = step == total_steps
        if val and args.val_every and (step % args.val_every == 0 or last):
            val_loss = parallel.sum(validation_loss(model, val, val_batches, args.loss))[0] / N
            parallel.print(f"step {step:5d} | val loss {val_loss:.6f} ({N * val_batches} batches)", flush=True)
            log({"step": step, "val_loss": val_loss})
        if args.sample_every and step > 0 and (step % args.sample_every == 0 or last) and parallel.is_main:
            print(f"step {step:5d} | sample: {sample(model, args, tokenizer, args.seed + step)!r}", flush=True)
        if last:
            break
        start = time.perf_counter()
        inputs, targets = train.next_batch()
        lr = learning_rate(step, args.lr, args.warmup_steps, total_steps, args.final_lr_frac)
        loss, norm = train_step(inputs, targets, lr)
        seconds = time.perf_counter() - start
        loss = parallel.sum(loss)[0] / N  # the step's loss over all N x B x T tokens
        step += 1
        tokens_per_s = N * B * T / seconds
        record = {"step": step, "loss": loss, "lr": lr, "ms": seconds * 1e3, "tokens_per_s": tokens_per_s}
        if norm is not None:
            record["grad_norm"] = norm
        log(record)
        parallel.print(
            f"step {step:5d}/{total_steps} | loss {loss:.6f} | lr {lr:.3e} | {seconds * 1e3:8.1f} ms | "
            f"{tokens_per_s:10,.0f} tok/s" + (f" | grad norm {norm:.3f}" if norm is not None else ""),
            flush=True,
        )
        if args.checkpoint_every and step % args.checkpoint_every == 0 and parallel.is_main:
            where = save_training_state(out_dir / f"checkpoint_{step:06d}", model, optimizer, step, train, vars(args))
            print(f"step {step:5d} | saved {where}", flush=True)

    train_step.release_graphs()
    memory = minitorch.peak_memory_mb(backend)
    log({"step": step, **memory})
    if not parallel.is_main:
        return {"args": args, "records": records, "model": model, "out_dir": out_dir, **memory}
    model.save_checkpoint(out_dir / STATE_MODEL)
    plot_losses(records, out_dir / PLOT_NAME, f"GPT-2 L{model.config.num_layers} C{model.config.channels}, {args.activation}")
    steady = [r["ms"] for r in records if "ms" in r][1:]
    print(
        f"done: {step} steps, median {np.median(steady) if steady else float('nan'):.1f} ms/step after the first, "
        f"peak memory {memory['peak_memory_mb']:,.0f} MiB ({memory['memory_kind']}); "
        f"wrote {out_dir / STATE_MODEL}, {out_dir / METRICS_NAME}, {out_dir / PLOT_NAME}",
        flush=True,
    )
    return {"args": args, "records": records, "model": model, "out_dir": out_dir, **memory}


if __name__ == "__main__":
    main()
