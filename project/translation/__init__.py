"""The German->English translation program: corpus, tokenizer and batches; the model, its train
step and run; greedy and beam-search decoding, evaluation, parameter averaging; and translate.py,
which translates with a trained run. `python -m project.translation` trains (main.py).

The data pipeline is this package's face for other code (benchmarks, notebooks):

    from project import translation
    corpus = translation.load_corpus(translation.DEFAULT_DATA_DIR)
    tokenizer = translation.train_tokenizer(corpus.train, 8000)
    batcher = translation.Batcher(translation.encode_pairs(tokenizer, corpus.train, 128).sequences, 128)
"""

from project.translation.batches import Batch, Batcher, encode_pairs, make_batch
from project.translation.corpus import DEFAULT_DATA_DIR, load_corpus, resolve_data_dir
from project.translation.tokenizer import decode_translations, encode_prompts, load_or_train_tokenizer, train_tokenizer

__all__ = [
    "Batch", "Batcher", "DEFAULT_DATA_DIR", "decode_translations", "encode_pairs", "encode_prompts", "load_corpus",
    "load_or_train_tokenizer", "make_batch", "resolve_data_dir", "train_tokenizer",
]  # fmt: skip
