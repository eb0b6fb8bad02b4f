"""Every kernel library by name (src/<name>.cu), with the ctypes signatures its binding declares."""

from __future__ import annotations

import ctypes
from typing import Dict, Tuple

from . import (
    attention, beam_search, classifier, combine, convert, embedding, integer, kv_cache, layernorm, matmul, matmul_bf16,
    optimizer, random, softmax, topk,
)  # fmt: skip
from .runtime import ERROR_STRING, Signatures, runtime

LIBRARIES: Dict[str, Signatures] = {
    "combine": combine.SIGNATURES,
    "convert_kernel": convert.SIGNATURES,
    "int_kernel": integer.SIGNATURES,
    "random_kernel": random.SIGNATURES,
    "matmul_kernel": matmul.SIGNATURES,
    "matmul_bf16_kernel": matmul_bf16.SIGNATURES,
    "embedding_kernel": embedding.SIGNATURES,
    "softmax_kernel": softmax.SIGNATURES,
    "layernorm_kernel": layernorm.SIGNATURES,
    "attention_kernel": attention.SIGNATURES,
    "attention_bf16_kernel": attention.BF16_SIGNATURES,
    "classifier_kernel": classifier.SIGNATURES,
    "optimizer_kernel": optimizer.SIGNATURES,
    "kv_cache_kernel": kv_cache.SIGNATURES,
    "topk_kernel": topk.SIGNATURES,
    "beam_search_kernel": beam_search.SIGNATURES,
}


def exported_symbols(name: str) -> Tuple[str, ...]:
    """The symbols the library built from src/<name>.cu must export."""
    return tuple(ERROR_STRING) + tuple(LIBRARIES[name])


def kernel_library(name: str) -> ctypes.CDLL:
    """The loaded library of src/<name>.cu (needs a GPU: it loads the runtime)."""
    return runtime().lib(name, LIBRARIES[name])
