"""Evaluation of the translation program, one path for every evaluation: the validation loss and
the test prompts decoded (greedy or beam search, each decoder sorting and batching the prompts once),
written out and scored with BLEU. Each epoch's evaluation decodes with --beam-size; the final one,
after training, averages the last epochs' parameters (--average-last) and reports greedy and
beam-search BLEU side by side, with their decoding times."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from minitorch import DecoderLM, TensorBackend, refresh_working_copies
from project.common.precision import compute_precision
from project.translation.average import average_snapshots
from project.translation.beam import BeamDecoder
from project.translation.decode import GreedyDecoder, corpus_bleu, write_translations
from project.translation.model import validation_loss
from project.translation.tokenizer import decode_translations

FINAL_NAME = "final.json"


class Decoders:
    """The run's decoders (greedy, and beam search per beam size), made on first use and kept: their
    caches and CUDA graphs (unless config["cuda_graphs"] is off) serve every later call, each epoch's
    evaluation and the final one (the graphs read the model's parameters, which training and
    load_state_dict update in place)."""

    def __init__(self, model: DecoderLM, config: Dict[str, Any], backend: TensorBackend):
        self.model, self.config, self.backend = model, config, backend
        self._made: Dict[int, Any] = {}

    def __call__(self, prompts: Sequence[np.ndarray], beam_size: int) -> List[np.ndarray]:
        """Tokens generated after each prompt: greedy (KV-cached) for beam_size 1, else beam search
        with config's length_penalty; config's max_len and eval_batch_size (sentences per batch)."""
        decoder = self._made.get(beam_size)
        if decoder is None:
            c, graphs = self.config, self.config.get("cuda_graphs", True)
            decoder = self._made[beam_size] = (
                GreedyDecoder(self.model, c["max_len"], self.backend, graphs) if beam_size == 1
                else BeamDecoder(self.model, c["max_len"], self.backend, beam_size, c["length_penalty"], graphs)
            )  # fmt: skip
        progress = "greedy decoding" if beam_size == 1 else f"beam-{beam_size} decoding"
        return decoder(prompts, self.config["eval_batch_size"], progress)


@dataclass(frozen=True)
class Decoded:
    """The test prompts decoded one way: BLEU against the references, seconds, the translations."""

    bleu: float
    seconds: float
    hypotheses: List[str]


def evaluate(
    decoders: Decoders, data: Mapping[str, Any], outputs: Mapping[str, Tuple[int, Path]]
) -> Tuple[float, Dict[str, Decoded]]:
    """(validation loss, {name: Decoded}) of decoders' model: for each output name, the test prompts
    decoded with its beam size (1: greedy), their translations written to its path with the sources
    and references; all in the run's --dtype. data: run.prepare_data's tokenizer, valid, sources,
    references and prompts."""
    model, config = decoders.model, decoders.config
    precision = compute_precision(config.get("dtype", "fp32"))
    with precision:
        valid_loss = validation_loss(model, data["valid"].sequences, config["eval_batch_size"], decoders.backend)
    decoded = {}
    for name, (beam_size, path) in outputs.items():
        start = time.perf_counter()
        with precision:
            generated = decoders(data["prompts"], beam_size)
        seconds = time.perf_counter() - start
        hypotheses = decode_translations(data["tokenizer"], generated)
        write_translations(path, data["sources"], data["references"], hypotheses)
        decoded[name] = Decoded(corpus_bleu(hypotheses, data["references"]), seconds, hypotheses)
    return valid_loss, decoded


def final_evaluation(
    model: DecoderLM, config: Dict[str, Any], data: Dict[str, Any], backend: TensorBackend, epoch: int,
    decoders: Optional[Decoders] = None,
) -> Dict[str, Any]:  # fmt: skip
    """Load the mean of the last config["average_last"] epochs' snapshots into model (when more than
    one), then evaluate it greedily and with config["final_beam_size"] beams (with `decoders`, the
    run's, or new ones); writes <out_dir>/final.json and translations_final_{greedy,beam}.txt and
    returns the record."""
    out_dir = Path(config["out_dir"])
    decoders = decoders or Decoders(model, config, backend)
    last = min(config["average_last"], epoch)
    if last > 1:
        model.load_state_dict(average_snapshots(out_dir, last, epoch))
        refresh_working_copies(p.value for p in model.parameters())  # the decoders' graphs read them
    outputs = {name: (beam, out_dir / f"translations_final_{name}.txt")
               for name, beam in (("greedy", 1), ("beam", config["final_beam_size"]))}  # fmt: skip
    valid_loss, decoded = evaluate(decoders, data, outputs)
    record: Dict[str, Any] = {
        "epoch": epoch,
        "averaged_epochs": list(range(epoch - last + 1, epoch + 1)),
        "valid_loss": valid_loss,
        "beam_size": config["final_beam_size"],
        "length_penalty": config["length_penalty"],
        "test_sentences": len(data["prompts"]),
    }
    for name, result in decoded.items():
        record[f"{name}_seconds"], record[f"{name}_bleu"] = result.seconds, result.bleu
    with open(out_dir / FINAL_NAME, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    averaged = f"mean of epochs {record['averaged_epochs'][0]}..{epoch}" if last > 1 else f"epoch {epoch}"
    print(
        f"final evaluation ({averaged}): valid loss {record['valid_loss']:.4f}, BLEU greedy {record['greedy_bleu']:.2f} "
        f"({record['greedy_seconds']:.2f}s), beam {record['beam_size']} (length penalty {record['length_penalty']}) "
        f"{record['beam_bleu']:.2f} ({record['beam_seconds']:.2f}s) on {len(data['prompts'])} test sentences",
        flush=True,
    )
    return record
