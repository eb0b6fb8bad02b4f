"""Evaluation of the translation program: decoding the test prompts (greedy or beam search) and the
final evaluation after training, which averages the last epochs' parameters (--average-last) and
reports greedy and beam-search BLEU side by side, with their decoding times."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from minitorch import DecoderLM, TensorBackend
from project.translation.tokenizer import decode_translations
from project.translation.average import average_snapshots
from project.translation.beam import BeamDecoder
from project.translation.decode import GreedyDecoder, corpus_bleu, write_translations
from project.translation.model import validation_loss

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
        return decoder(prompts, self.config["eval_batch_size"])


def final_evaluation(
    model: DecoderLM, config: Dict[str, Any], data: Dict[str, Any], backend: TensorBackend, epoch: int,
    decoders: Optional[Decoders] = None,
) -> Dict[str, Any]:  # fmt: skip
    """Load the mean of the last config["average_last"] epochs' snapshots into model (when more than
    one), then decode the test prompts greedily and with config["final_beam_size"] beams (with
    `decoders`, the run's, or new ones); writes
    <out_dir>/final.json and translations_final_{greedy,beam}.txt and returns the record.  data:
    mt_run.prepare_data's tokenizer, valid, sources, references and prompts."""
    out_dir = Path(config["out_dir"])
    decoders = decoders or Decoders(model, config, backend)
    last = min(config["average_last"], epoch)
    if last > 1:
        model.load_state_dict(average_snapshots(out_dir, last, epoch))
    prompts, references = data["prompts"], data["references"]
    record: Dict[str, Any] = {
        "epoch": epoch,
        "averaged_epochs": list(range(epoch - last + 1, epoch + 1)),
        "valid_loss": validation_loss(model, data["valid"].sequences, config["eval_batch_size"], backend),
        "beam_size": config["final_beam_size"],
        "length_penalty": config["length_penalty"],
        "test_sentences": len(prompts),
    }
    for name, beam_size in (("greedy", 1), ("beam", config["final_beam_size"])):
        start = time.perf_counter()
        generated = decoders(prompts, beam_size)
        record[f"{name}_seconds"] = time.perf_counter() - start
        hypotheses = decode_translations(data["tokenizer"], generated)
        record[f"{name}_bleu"] = corpus_bleu(hypotheses, references)
        write_translations(out_dir / f"translations_final_{name}.txt", data["sources"], references, hypotheses)
    with open(out_dir / FINAL_NAME, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    averaged = f"mean of epochs {record['averaged_epochs'][0]}..{epoch}" if last > 1 else f"epoch {epoch}"
    print(
        f"final evaluation ({averaged}): valid loss {record['valid_loss']:.4f}, BLEU greedy {record['greedy_bleu']:.2f} "
        f"({record['greedy_seconds']:.2f}s), beam {record['beam_size']} (length penalty {record['length_penalty']}) "
        f"{record['beam_bleu']:.2f} ({record['beam_seconds']:.2f}s) on {len(prompts)} test sentences",
        flush=True,
    )
    return record
