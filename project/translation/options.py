"""The translation program's options: one parser whose types carry every bound, the presets, and
the configuration of a run (the command line's, or a resumed checkpoint's with the options a
resumed run may change), checked before anything is trained."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from project.common.checkpoint import Checkpoint, CheckpointError, check_config, describe, load_checkpoint, previous_path
from project.common.console import OneLineParser
from project.common.options import (
    FRACTION,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    Bounded,
    InputError,
    add_compute_options,
    bound_problems,
    given_options,
    lenient,
    option,
)
from project.common.parallel import add_parallel_options
from project.common.presets import add_preset_option, apply_preset
from project.translation.corpus import DATA_DIR_ENV, DEFAULT_BASE_URL, DEFAULT_DATA_DIR
from project.translation.tokenizer import MIN_VOCAB_SIZE

CHECKPOINT_NAME = "checkpoint.npz"
CHECKPOINT_KIND = "machine_translation"
# Options a resumed run may change; all others are taken from the checkpoint (and must match it
# when given on the command line), since they define the model, the data or the optimization.
# --loss, --recompute-layers, --attention and --dtype change how the same function is computed (memory, speed,
# rounding), not the model (the checkpoint keeps float32 master weights in either dtype); the decoding and
# averaging options change only the evaluation.
RUN_CONTROL = {
    "epochs", "backend", "use_fused_kernel", "data_dir", "download", "eval_batch_size", "valid_samples",
    "test_samples", "out_dir", "resume", "loss", "recompute_layers", "attention", "save_every_steps",
    "save_every_minutes", "cuda_graphs", "log_every", "matmul_precision", "beam_size", "final_beam_size",
    "length_penalty", "average_last", "micro_batch_size", "zero", "dist_timeout", "lost_rank_timeout", "dtype",
}  # fmt: skip
# Options newer than some checkpoints that change the training, with the value those checkpoints trained with
# (--batch-size was per process before --scale-batch-with-world).
TRAINED_BEFORE = {"label_smoothing": 0.0, "lr_scaling": "none", "scale_batch_with_world": True}
# --preset NAME: defaults of a run (explicit options still win). full: the parser's defaults, the real
# run for a GPU; tiny: minutes on a 2-core CPU; auto (the default): full on CUDA, tiny on a CPU.
PRESETS = {
    "full": {},
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
    """The program's options; a value out of its bound is a usage error naming the option."""
    p = OneLineParser(
        description="German->English translation with a minitorch decoder-only transformer (Multi30k).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_preset_option(p, PRESETS)
    model = p.add_argument_group("model")
    model.add_argument("--n-embd", type=POSITIVE_INT, default=256, help="model width")
    model.add_argument("--n-head", type=POSITIVE_INT, default=8, help="attention heads")
    model.add_argument("--n-layers", type=POSITIVE_INT, default=4, help="transformer layers")
    model.add_argument("--dropout", type=FRACTION, default=0.1, help="dropout probability")
    model.add_argument("--max-len", type=Bounded(int, low=3, why="a German token, <eos_de> and a reply"), default=128,
                       help="longest sequence de <eos_de> en <eos_en> in tokens (longer pairs are dropped)")
    model.add_argument("--vocab-size", type=Bounded(int, low=MIN_VOCAB_SIZE, why="3 special tokens + 256 bytes"),
                       default=8000, help="byte-level BPE vocabulary")
    opt = p.add_argument_group("optimization")
    opt.add_argument("--seed", type=int, default=0, help="seed of initialization, dropout and batch order")
    opt.add_argument("--epochs", type=POSITIVE_INT, default=10, help="epochs to train in all")
    opt.add_argument("--batch-size", type=POSITIVE_INT, default=128,
                     help="training pairs per step, over all processes under torchrun (see --micro-batch-size, "
                     "--scale-batch-with-world)")
    opt.add_argument("--samples-per-epoch", type=POSITIVE_INT, default=None,
                     help="training pairs drawn per epoch (None: all)")
    opt.add_argument("--lr", type=POSITIVE, default=1e-3, help="peak learning rate of AdamW")
    opt.add_argument("--warmup-steps", type=NON_NEGATIVE_INT, default=200,
                     help="linear warmup, then cosine decay to 0 (counted in batches of --batch-size: under "
                     "--scale-batch-with-world a step of N processes counts N)")
    opt.add_argument("--weight-decay", type=NON_NEGATIVE, default=0.01, help="decoupled (AdamW) weight decay")
    opt.add_argument("--grad-clip", type=NON_NEGATIVE, default=1.0, help="global gradient-norm clip (0: off)")
    opt.add_argument("--label-smoothing", type=FRACTION, default=0.0,
                     help="train against (1 - e) * onehot + e / vocab (the validation loss stays unsmoothed)")
    add_parallel_options(p, rows="pairs")
    how = add_compute_options(p, attention="naive", loss="naive")
    how.add_argument("--checkpoint", action=RenamedOption, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    run = p.add_argument_group("data, outputs, checkpoints")
    run.add_argument("--data-dir", default=None,
                     help=f"corpus directory (None: ${DATA_DIR_ENV} or {DEFAULT_DATA_DIR})")
    run.add_argument("--download", action="store_true",
                     help=f"fetch missing corpus files from {DEFAULT_BASE_URL} into the cache (needs network)")
    run.add_argument("--out-dir", default="runs/mt", help="metrics, translations, tokenizer and checkpoint")
    run.add_argument("--resume", action="store_true", help="continue the run saved in --out-dir")
    run.add_argument("--save-every-steps", type=NON_NEGATIVE_INT, default=0,
                     help="also checkpoint every N training steps (0: only at epoch ends and by time)")
    run.add_argument("--save-every-minutes", type=NON_NEGATIVE, default=10.0,
                     help="also checkpoint when this many minutes passed since the last save (0: off)")
    run.add_argument("--log-every", type=POSITIVE_INT, default=50,
                     help="steps between progress-bar loss readings (each one waits for the GPU)")
    evaluation = p.add_argument_group("evaluation")
    evaluation.add_argument("--eval-batch-size", type=POSITIVE_INT, default=256, help="sequences per evaluation batch")
    evaluation.add_argument("--valid-samples", type=POSITIVE_INT, default=None,
                            help="validation loss over the first N validation pairs only (None: all)")
    evaluation.add_argument("--test-samples", type=POSITIVE_INT, default=None,
                            help="decode only the first N test sentences (None: all)")
    evaluation.add_argument("--beam-size", type=POSITIVE_INT, default=1,
                            help="per-epoch test decoding: 1 greedy, more: beam search with this many beams")
    evaluation.add_argument("--final-beam-size", type=POSITIVE_INT, default=4,
                            help="beams of the final evaluation's beam-search figure (it also reports greedy)")
    evaluation.add_argument("--length-penalty", type=NON_NEGATIVE, default=1.0,
                            help="beam search ranks finished hypotheses by log-prob / length ** this")
    evaluation.add_argument("--average-last", type=POSITIVE_INT, default=1,
                            help="final evaluation of the mean parameters of the last N epochs (snapshots "
                            "params_epoch*.npz)")
    return p


def parse(argv: Optional[Sequence[str]]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(every option, the options given on the command line); --preset changes the defaults and is
    resolved ("auto": "full" or "tiny" for --backend). Values out of bounds pass here: check_options
    reports them all at once."""
    parser = lenient(build_parser())
    preset = apply_preset(parser, PRESETS, argv)
    return {**vars(parser.parse_args(argv)), "preset": preset}, given_options(lenient(build_parser()), argv)


def check_options(config: Dict[str, Any]) -> None:
    """Raise InputError listing every option that cannot work: out of its bound (the parser's), or
    not fitting another one."""
    problems: List[str] = []
    if config["n_embd"] % config["n_head"]:
        problems.append(f"--n-embd {config['n_embd']} is not a multiple of --n-head {config['n_head']}")
    problems += bound_problems(build_parser(), config)
    if problems:
        raise InputError("; ".join(problems))


def resolve_config(args: Dict[str, Any], explicit: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[Checkpoint]]:
    """(configuration, checkpoint or None), checked, from parse()'s result. A resumed run takes its
    configuration from the checkpoint, with the RUN_CONTROL options the command line sets."""
    path = Path(args["out_dir"]) / CHECKPOINT_NAME
    if not args["resume"]:
        for existing in (path, previous_path(path)):
            if existing.exists():
                raise InputError(f"{existing} exists; pass --resume to continue that run or choose another --out-dir")
        check_options(args)
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
    check_options(config)
    return config, checkpoint
