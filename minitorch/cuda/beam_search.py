"""Bindings of beam_search_kernel.so (src/beam_search_kernel.cu): one step of beam search's
bookkeeping on the device (minitorch.beam_search documents the state and its contract)."""

from __future__ import annotations

import ctypes

from ..tensor_data import TensorData
from .combine import contiguous
from .runtime import check, ptr, runtime

_P, _I, _F, _D = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_double
SIGNATURES = {
    "launch_beam_search_step": (_I, [_P] * 11 + [_I] * 6 + [_F, _D, _P]),
}


def beam_search_step(
    values: TensorData, indices: TensorData, step: TensorData, room: TensorData, scores: TensorData,
    tokens: TensorData, sources: TensorData, done: TensorData, history: TensorData, finished: TensorData,
    finished_count: TensorData, beam: int, vocab: int, eos: int, dead: float, length_penalty: float,
) -> None:  # fmt: skip
    """The state buffers (contiguous: step [1], room and done [sentences], scores, tokens and sources
    [rows], history [max_steps, 2, rows], finished [sentences, beam, 4], finished_count [sentences])
    updated in place from the step's candidates values, indices [sentences, candidates]."""
    rt = runtime()
    lib = rt.lib("beam_search_kernel", SIGNATURES)
    sentences, candidates = values.shape
    buffers = (step, room, scores, tokens, sources, done, history, finished, finished_count)
    code = lib.launch_beam_search_step(
        ptr(contiguous(values)), ptr(contiguous(indices)), *(ptr(b) for b in buffers), sentences, beam, vocab,
        candidates, history.shape[0], eos, dead, length_penalty, rt.stream(),
    )  # fmt: skip
    check(code, lib, f"beam_search_step of {sentences} sentences x {beam} beams")
