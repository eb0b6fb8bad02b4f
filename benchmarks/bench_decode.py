"""Decoding-speed benchmark: the Multi30k test set translated by a trained run, side by side.

  greedy, recompute            the decoder before the KV cache: every step re-runs the model on the
                               prefix (project/mt_decode.greedy_decode_recompute): the baseline
  greedy, KV cache, eager      each step feeds one token per row (project/mt_decode.GreedyDecoder),
                               its ~100 kernels dispatched from Python one by one
  greedy, KV cache + graphs    the same steps replayed from CUDA graphs (one per attention width)
  beam N, eager / + graphs     batched beam search (project/mt_beam.BeamDecoder), likewise

Each method decodes all test sentences once (reported as the first call: for the graph methods it
includes capturing their graphs; for the others it plans every kernel layout), then `--repeats`
times with the same decoder (graphs replayed); reported: the median wall time of the repeats
(decoding returns host token ids, so the GPU has finished), sentences/s, the speedup over the
baseline, BLEU, how many outputs equal the reference decoder's (greedy: the recompute decoder;
beam: the eager beam search), decoding steps per call, and the steps replayed from graphs. Also
the beam search's top-k of one step's candidates: the top-k kernel, the composed top-k (k rounds of
tensor ops) and reading the [B, beam * V] scores back to select with NumPy (argpartition).

Usage: python benchmarks/bench_decode.py --run RUN_DIR [--data-dir DIR] [--beam-size 4] [--out DIR]
RUN_DIR is the output directory of a training run (project/run_machine_translation.py --out-dir,
e.g. `--epochs 24 --dropout 0.2 --label-smoothing 0.1 --average-last 5`, 24 epochs in ~35 s on an
H100); the bench loads its checkpoint and tokenizer with project/translate.py's loader.
Writes DIR/bench_decode.json and DIR/bench_decode.png (default DIR: benchmarks/results/bench_decode).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from common import Column, Panel, Table, out_option, wall_clock, write_results
import minitorch
from minitorch.fused.topk import _composed_top_k, top_k
from project import translation as mt_data
from project.translation.beam import BeamDecoder
from project.translation.decode import GreedyDecoder, corpus_bleu, greedy_decode_recompute
from project.translation.translate import load_translator

BASELINE = "greedy, recompute"


def timed(fn: Callable[[], Any], repeats: int) -> Dict[str, Any]:
    clock = wall_clock(fn, repeats)
    return {"seconds": clock.median, "all_seconds": clock.seconds, "result": clock.results[-1]}


def top_k_costs(backend: minitorch.TensorBackend, rows: int, width: int, k: int, repeats: int) -> Dict[str, Any]:
    """Median seconds of selecting the top k of [rows, width] scores: kernel, composed, on the host."""
    rng = np.random.default_rng(0)
    scores = minitorch.tensor_from_numpy(rng.standard_normal((rows, width)), backend=backend)

    def host() -> np.ndarray:
        x = scores.to_numpy()
        part = np.argpartition(-x, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(x, part, 1), axis=1)
        return np.take_along_axis(part, order, 1)

    kernel = timed(lambda: top_k(scores, k)[1].to_numpy().astype(np.int64), repeats + 1)
    composed = timed(lambda: _composed_top_k(scores, k)[1].to_numpy().astype(np.int64), repeats + 1)
    on_host = timed(host, repeats + 1)
    assert np.array_equal(kernel["result"], on_host["result"]), "kernel and host top-k disagree"
    assert np.array_equal(composed["result"], on_host["result"]), "composed and host top-k disagree"
    return {"rows": rows, "width": width, "k": k, "kernel_seconds": kernel["seconds"],
            "composed_seconds": composed["seconds"], "host_seconds": on_host["seconds"]}  # fmt: skip


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and each option's default."""


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--run", required=True, help="output directory of project/run_machine_translation.py")
    parser.add_argument("--data-dir", default=None, help="Multi30k directory (None: the program's)")
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda", help="decoding backend")
    parser.add_argument("--beam-size", type=int, default=4, help="beams of the beam search rows")
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per batch (the program's default)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per method after the first")
    parser.add_argument("--sentences", type=int, default=None, help="decode the first N test sentences (None: all)")
    out_option(parser, "bench_decode")
    args = parser.parse_args(argv)

    backend = minitorch.choose_backend(args.backend).backend
    model, tokenizer, config = load_translator(args.run, backend)
    test = mt_data.load_corpus(args.data_dir).test[: args.sentences]
    sources, references = [de for de, _ in test], [en for _, en in test]
    prompts = mt_data.encode_prompts(tokenizer, sources, config["max_len"])
    max_len, n, lp, beam = config["max_len"], len(prompts), config.get("length_penalty", 1.0), args.beam_size
    eager_beam = f"beam {beam}, eager"
    def recompute(p: List[np.ndarray], b: int) -> List[np.ndarray]:
        return greedy_decode_recompute(model, p, max_len, b, backend)

    def greedy(graphs: bool) -> Callable[[], Any]:
        return lambda: GreedyDecoder(model, max_len, backend, graphs)

    def beams(graphs: bool) -> Callable[[], Any]:
        return lambda: BeamDecoder(model, max_len, backend, beam, lp, graphs)

    methods: Dict[str, Tuple[Callable[[], Any], int, str]] = {  # name: (make decoder, batch size, reference)
        BASELINE: (lambda: recompute, args.batch_size, BASELINE),
        "greedy, KV cache, eager": (greedy(False), args.batch_size, BASELINE),
        f"greedy, KV cache, eager, batch {n}": (greedy(False), n, BASELINE),
        "greedy, KV cache + graphs": (greedy(True), args.batch_size, BASELINE),
        f"greedy, KV cache + graphs, batch {n}": (greedy(True), n, BASELINE),
        eager_beam: (beams(False), args.batch_size, eager_beam),
        f"beam {beam} + graphs": (beams(True), args.batch_size, eager_beam),
        f"beam {beam} + graphs, batch {n}": (beams(True), n, eager_beam),
    }
    results: Dict[str, Any] = {
        "device": backend_name(args.backend), "run": str(args.run), "sentences": n, "batch_size": args.batch_size,
        "beam_size": beam, "length_penalty": lp, "max_len": max_len, "methods": {},
    }  # fmt: skip
    outputs: Dict[str, List[np.ndarray]] = {}
    for name, (make, batch, reference) in methods.items():
        decode = make()
        start = time.perf_counter()
        decode(prompts, batch)
        first = time.perf_counter() - start
        steps_before = getattr(decode, "steps", 0)
        r = timed(lambda: decode(prompts, batch), args.repeats)
        r["first_seconds"] = first
        outputs[name] = r.pop("result")
        r["bleu"] = corpus_bleu(mt_data.decode_translations(tokenizer, outputs[name]), references)
        r["reference"] = reference
        r["same_as_reference"] = sum(np.array_equal(a, b) for a, b in zip(outputs[name], outputs[reference]))
        r["sentences_per_s"] = n / r["seconds"]
        r["batch"] = batch
        if hasattr(decode, "steps"):
            r["steps_per_call"] = (decode.steps - steps_before) / args.repeats
            r["step_counts"] = dict(decode.decoder.counts)
        results["methods"][name] = r
        del decode  # its caches and graphs
    base = results["methods"][BASELINE]["seconds"]
    for r in results["methods"].values():
        r["speedup_vs_recompute"] = base / r["seconds"]
    results["top_k"] = top_k_costs(backend, args.batch_size, beam * model.n_vocab, 2 * beam, 10)
    report(results)
    write_results(args.out, "bench_decode", results, panels(results), size=(9, 4.5))


def replayed(r: Dict[str, Any]) -> Optional[str]:
    """Steps replayed from graphs / steps after the first, over all calls (None: no step counts)."""
    counts = r.get("step_counts")
    return f"{counts['replayed']}/{counts['replayed'] + counts['eager']}" if counts else None


def report(results: Dict[str, Any]) -> None:
    n = results["sentences"]
    print(f"{results['device']}: {n} Multi30k test sentences, max_len {results['max_len']}, "
          f"beam {results['beam_size']}, length penalty {results['length_penalty']}")  # fmt: skip
    table = Table(
        Column("method", 38, "method", left=True),
        Column("batch", 5, "batch"),
        Column("first s", 8, "first_seconds", ".3f"),
        Column("seconds", 8, "seconds", ".3f"),
        Column("sent/s", 7, "sentences_per_s", ".0f"),
        Column("speedup", 8, "speedup_vs_recompute", ".2f", "x"),
        Column("BLEU", 6, "bleu", ".2f"),
        Column("= ref", 10, lambda r: f"{r['same_as_reference']}/{n}"),
        Column("steps", 6, "steps_per_call", ".0f"),
        Column("replayed", 9, replayed),
    )  # fmt: skip
    table.header()
    for name, r in results["methods"].items():
        table.row({"method": name, **r})
    print("(= ref: outputs equal to the reference method's: greedy rows the recompute decoder, beam rows the "
          "eager beam search; steps: decoding steps per call; replayed: steps replayed from graphs / steps "
          "after the first, over all calls)")  # fmt: skip
    t = results["top_k"]
    print(f"top-{t['k']} of [{t['rows']}, {t['width']}] per step: kernel {1e3 * t['kernel_seconds']:.3f} ms, "
          f"composed {1e3 * t['composed_seconds']:.2f} ms, host (read back + argpartition) "
          f"{1e3 * t['host_seconds']:.2f} ms")  # fmt: skip


def backend_name(name: str) -> str:
    if name == "cuda":
        import torch

        return torch.cuda.get_device_name()
    return "cpu (FastOps)"


def panels(results: Dict[str, Any]) -> List[Panel]:
    """Median seconds of each method, with its speedup over the baseline and its BLEU."""
    methods = results["methods"]
    notes = [f"{r['seconds']:.3f}s ({r['speedup_vs_recompute']:.1f}x), BLEU {r['bleu']:.2f}" for r in methods.values()]
    return [Panel(list(methods), {"seconds": [r["seconds"] for r in methods.values()]}, kind="barh", notes=notes,
                  colors=["tab:blue"], xlabel=f"seconds to decode {results['sentences']} test sentences (median)",
                  title=f"Decoding on {results['device']}")]


if __name__ == "__main__":
    main()
