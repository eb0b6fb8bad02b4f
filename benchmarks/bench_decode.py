"""Decoding-speed benchmark: the Multi30k test set translated by a trained run, side by side.

  greedy, recompute   the decoder before the KV cache: every step re-runs the model on the prefix
  greedy, KV cache    each step feeds one token per row (project/mt_decode.greedy_decode)
  beam N, KV cache    batched beam search (project/mt_beam.beam_search)

Each method decodes all test sentences `--repeats` times after a warm-up on the first 64 (which
plans every kernel layout); reported: the median wall time (decoding returns host token ids, so the
GPU has finished), sentences/s, BLEU and how many outputs equal the recompute decoder's. Also the
beam search's top-k: the device selection (k rounds of a row max) against reading the
[B, beam * V] candidate scores back and selecting with NumPy (argpartition), one step's shape.

Usage: python benchmarks/bench_decode.py --run RUN_DIR [--data-dir DIR] [--beam-size 4] [--out DIR]
Writes DIR/bench_decode.json and DIR/bench_decode.png (default DIR: benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import minitorch  # noqa: E402
from project import mt_data  # noqa: E402
from project.mt_beam import beam_search, top_k  # noqa: E402
from project.mt_decode import corpus_bleu, greedy_decode, greedy_decode_recompute  # noqa: E402
from project.mt_train import make_backend  # noqa: E402
from project.translate import load_translator  # noqa: E402


def timed(fn: Callable[[], Any], repeats: int) -> Dict[str, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "all_seconds": times, "result": result}


def top_k_costs(backend: minitorch.TensorBackend, rows: int, width: int, k: int, repeats: int) -> Dict[str, float]:
    """Median seconds of selecting the top k of [rows, width] scores on the device and on the host."""
    rng = np.random.default_rng(0)
    scores = minitorch.tensor_from_numpy(rng.standard_normal((rows, width)), backend=backend)
    columns = minitorch.tensor_from_numpy(np.arange(width)[None, :], backend=backend)

    def host() -> np.ndarray:
        x = scores.to_numpy()
        part = np.argpartition(-x, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(x, part, 1), axis=1)
        return np.take_along_axis(part, order, 1)

    device = timed(lambda: top_k(scores, k, columns)[1], repeats + 1)
    on_host = timed(host, repeats + 1)
    assert np.array_equal(device["result"], on_host["result"]), "device and host top-k disagree"
    return {"rows": rows, "width": width, "k": k, "device_seconds": device["seconds"], "host_seconds": on_host["seconds"]}


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="output directory of project/run_machine_translation.py")
    parser.add_argument("--data-dir", default=None, help="Multi30k directory (default: the program's)")
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per batch (the program's default)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)

    backend, _ = make_backend(args.backend)
    model, tokenizer, config = load_translator(args.run, backend)
    test = mt_data.load_corpus(args.data_dir).test
    sources, references = [de for de, _ in test], [en for _, en in test]
    prompts = mt_data.encode_prompts(tokenizer, sources, config["max_len"])
    max_len, n, lp = config["max_len"], len(prompts), config.get("length_penalty", 1.0)
    methods: Dict[str, Callable[..., List[np.ndarray]]] = {
        "greedy, recompute": lambda p, b: greedy_decode_recompute(model, p, max_len, b, backend),
        "greedy, KV cache": lambda p, b: greedy_decode(model, p, max_len, b, backend),
        f"greedy, KV cache, batch {n}": lambda p, b: greedy_decode(model, p, max_len, n, backend),
        f"beam {args.beam_size}, KV cache": lambda p, b: beam_search(model, p, max_len, b, backend, args.beam_size, lp),
    }
    results: Dict[str, Any] = {
        "device": backend_name(args.backend), "run": str(args.run), "sentences": n, "batch_size": args.batch_size,
        "beam_size": args.beam_size, "length_penalty": lp, "methods": {},
    }  # fmt: skip
    reference = None
    for name, decode in methods.items():
        decode(prompts[:64], args.batch_size)
        r = timed(lambda: decode(prompts, args.batch_size), args.repeats)
        generated = r.pop("result")
        if reference is None:
            reference = generated
        r["bleu"] = corpus_bleu(mt_data.decode_translations(tokenizer, generated), references)
        r["same_as_recompute"] = sum(np.array_equal(a, b) for a, b in zip(generated, reference))
        r["sentences_per_s"] = n / r["seconds"]
        results["methods"][name] = r
    base = results["methods"]["greedy, recompute"]["seconds"]
    for r in results["methods"].values():
        r["speedup_vs_recompute"] = base / r["seconds"]
    results["top_k"] = top_k_costs(backend, args.batch_size, args.beam_size * model.n_vocab, 2 * args.beam_size, 10)

    print(f"{results['device']}: {n} Multi30k test sentences, max_len {max_len}, batch {args.batch_size} sentences")
    print(f"{'method':<32}{'seconds':>9}{'sent/s':>9}{'speedup':>9}{'BLEU':>8}{'= recompute':>13}")
    for name, r in results["methods"].items():
        print(f"{name:<32}{r['seconds']:>9.3f}{r['sentences_per_s']:>9.0f}{r['speedup_vs_recompute']:>8.2f}x"
              f"{r['bleu']:>8.2f}{r['same_as_recompute']:>8}/{n}")
    t = results["top_k"]
    print(f"top-{t['k']} of [{t['rows']}, {t['width']}] per step: device {1e3 * t['device_seconds']:.2f} ms, "
          f"host (read back + argpartition) {1e3 * t['host_seconds']:.2f} ms")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_decode.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "bench_decode.png")
    print(f"wrote {out / 'bench_decode.json'} and {out / 'bench_decode.png'}")


def backend_name(name: str) -> str:
    if name == "cuda":
        import torch

        return torch.cuda.get_device_name()
    return "cpu (FastOps)"


def plot(results: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["methods"])
    seconds = [results["methods"][m]["seconds"] for m in names]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    bars = ax.barh(names[::-1], seconds[::-1], color="tab:blue")
    for bar, name in zip(bars, names[::-1]):
        r = results["methods"][name]
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['seconds']:.2f}s, BLEU {r['bleu']:.2f}",
                va="center", fontsize=8)
    ax.set_xlabel(f"seconds to decode {results['sentences']} test sentences (median)")
    ax.set_title(f"Decoding on {results['device']}")
    ax.set_xlim(0, max(seconds) * 1.5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
