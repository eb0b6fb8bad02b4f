"""Translate German sentences into English with a model trained by project/run_machine_translation.py.

Sentences come from the command line, from a file (one per line) or from standard input; the
translations go to standard output, one line each, in order. The model's configuration and
parameters come from the run's checkpoint.npz, the tokenizer from the same directory; with
--average-last N (default: what the run was trained with) the parameters are the mean of the last
N epoch snapshots the run kept.

    python project/translate.py --checkpoint runs/mt "Ein Mann fährt Fahrrad." "Zwei Hunde spielen."
    python -m project.translation.translate --checkpoint runs/mt "Ein Hund läuft."
    python project/translate.py --checkpoint runs/mt --file sentences.de > sentences.en
    echo "Ein Hund läuft im Schnee." | python project/translate.py --checkpoint runs/mt --backend cpu
    python project/translate.py --checkpoint runs/mt --dtype bf16 "Ein Mann fährt Fahrrad."

The model decodes in the run's --dtype unless --dtype says otherwise (the checkpoint holds float32
weights, so either works).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tokenizers import Tokenizer

from minitorch import DecoderLM, TensorBackend
from project.common.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from project.common.options import InputError, backend_from_option
from project.common.precision import DTYPES, compute_precision
from project.translation.average import average_snapshots
from project.translation.beam import beam_search
from project.translation.decode import greedy_decode
from project.translation.model import build_model
from project.translation.options import CHECKPOINT_KIND, CHECKPOINT_NAME
from project.translation.tokenizer import decode_translations, encode_prompts, load_tokenizer, tokenizer_path

MODEL_KEYS = ("n_embd", "n_head", "n_layers", "max_len", "vocab_size", "dropout", "use_fused_kernel")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Translate German to English with a checkpoint of project/run_machine_translation.py.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("sentences", nargs="*", help="German sentences (none: read --file or standard input)")
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="the training run's --out-dir")
    p.add_argument("--file", default=None, help="read sentences from this file, one per line")
    p.add_argument("--backend", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda when its kernels load here, else cpu")
    p.add_argument("--beam-size", type=int, default=4, help="1: greedy decoding")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   help="beam search ranks finished hypotheses by log-prob / length ** this")
    p.add_argument("--average-last", type=int, default=None,
                   help="mean parameters of the last N epoch snapshots (default: the run's --average-last)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences decoded together")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="decode in float32 or in bf16 (bf16 weight copies and activations; default: the run's --dtype)")
    return p


def fail(message: str) -> SystemExit:
    return SystemExit(f"error: {message}")


def read_run(directory: Path) -> Checkpoint:
    """The checkpoint of a translation run in directory, checked to be one."""
    if not directory.is_dir():
        raise fail(f"--checkpoint {directory}: no such directory")
    path = directory / CHECKPOINT_NAME
    if not path.is_file():
        raise fail(f"{directory} has no {CHECKPOINT_NAME}: not an output directory of project/run_machine_translation.py")
    try:
        checkpoint = load_checkpoint(path, CHECKPOINT_KIND)
    except CheckpointError as err:
        raise fail(str(err)) from None
    missing = [key for key in MODEL_KEYS if key not in checkpoint.config]
    if missing or not isinstance(checkpoint.state.get("model"), dict):
        raise fail(f"{path} is not a usable translation checkpoint: its configuration lacks {missing} or it has no parameters")
    return checkpoint


def load_translator(
    directory: str | Path, backend: TensorBackend, average_last: Optional[int] = None
) -> Tuple[DecoderLM, Tokenizer, Dict[str, Any]]:
    """(model in eval mode, tokenizer, the run's configuration) of a training run's output directory;
    the parameters are the mean of the last average_last epoch snapshots (default: the run's
    --average-last) or, for 1, the checkpoint's."""
    directory = Path(directory)
    checkpoint = read_run(directory)
    config = checkpoint.config
    tokenizer_file = tokenizer_path(directory, config["vocab_size"])
    if not tokenizer_file.is_file():
        raise fail(f"{directory} has a checkpoint but no tokenizer {tokenizer_file.name}")
    tokenizer = load_tokenizer(tokenizer_file)
    model = build_model(config, tokenizer.get_vocab_size(), backend)
    last = config.get("average_last", 1) if average_last is None else average_last
    if last < 1:
        raise fail(f"--average-last must be >= 1, got {last}")
    try:
        epoch = int(checkpoint.state["progress"]["epoch"])
        params = average_snapshots(directory, last, epoch) if last > 1 else checkpoint.state["model"]
        model.load_state_dict(params)
    except (FileNotFoundError, KeyError, ValueError, TypeError) as e:
        raise fail(f"{directory}: the saved parameters do not fit the model its configuration describes: {e}") from e
    model.eval()
    return model, tokenizer, config


def translate(
    model: DecoderLM, tokenizer: Tokenizer, sentences: Sequence[str], max_len: int, backend: TensorBackend,
    beam_size: int = 4, length_penalty: float = 1.0, batch_size: int = 64,
) -> List[str]:  # fmt: skip
    """English translations of German sentences, each one line (line breaks the model may produce
    become spaces); a blank sentence gives an empty line, so a file's lines stay aligned with their
    translations."""
    wanted = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    translations = [""] * len(sentences)
    if not wanted:
        return translations
    prompts = encode_prompts(tokenizer, [sentences[i].strip() for i in wanted], max_len)
    if beam_size == 1:
        generated = greedy_decode(model, prompts, max_len, batch_size, backend)
    else:
        generated = beam_search(model, prompts, max_len, batch_size, backend, beam_size, length_penalty)
    for i, text in zip(wanted, decode_translations(tokenizer, generated)):
        translations[i] = one_line(text)
    return translations


def one_line(text: str) -> str:
    """text without surrounding whitespace, its line breaks (all that str.splitlines knows) as spaces."""
    return " ".join(text.strip().splitlines())


def read_sentences(args: argparse.Namespace) -> List[str]:
    if args.sentences and args.file:
        raise fail("give sentences as arguments or --file, not both")
    if args.sentences:
        return list(args.sentences)
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise fail(f"--file {path}: no such file")
        return path.read_text(encoding="utf-8").splitlines()
    return sys.stdin.read().splitlines()


def main(argv: Optional[Sequence[str]] = None) -> List[str]:
    """Print (and return) the translation of every input sentence."""
    args = build_parser().parse_args(argv)
    if args.beam_size < 1 or args.batch_size < 1 or args.length_penalty < 0:
        raise fail(
            f"--beam-size and --batch-size must be >= 1 and --length-penalty >= 0, got {args.beam_size}, "
            f"{args.batch_size} and {args.length_penalty}"
        )
    try:
        backend = backend_from_option(args.backend).backend
    except InputError as err:
        raise fail(str(err)) from None
    model, tokenizer, config = load_translator(args.checkpoint, backend, args.average_last)
    sentences = read_sentences(args)
    with compute_precision(args.dtype or config.get("dtype", "fp32")):
        translations = translate(
            model, tokenizer, sentences, config["max_len"], backend, args.beam_size, args.length_penalty, args.batch_size
        )
    for line in translations:
        print(line, flush=True)
    return translations


if __name__ == "__main__":
    main()
