"""Multi30k German->English data for the machine-translation program.

The pipeline, in the order the training program uses it:

1. ``load_corpus`` finds ``{train,valid,test}.{de,en}`` (plain or ``.gz``) in the data directory
   or the download cache; only when asked (``download=True``) does it fetch missing files from the
   corpus's public origin into the cache, checked against SHA-256 checksums of the uncompressed text.
2. ``load_or_train_tokenizer`` trains a byte-level BPE tokenizer on the training split (both
   languages, one shared vocabulary) and keeps it as JSON in the output directory, so a resumed
   run reuses it.
3. ``encode_pairs`` turns each pair into one sequence ``de <eos_de> en <eos_en>``.
4. ``Batcher`` (training) and ``eval_batches`` (evaluation) produce padded numpy batches whose
   loss weights select the English tokens and the final ``<eos_en>`` as the only targets.
5. ``encode_prompts`` / ``pad_prompts`` / ``decode_translations`` serve greedy decoding.

Nothing here depends on minitorch: batches are numpy arrays.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = PROJECT_ROOT.parent / "shared" / "data" / "multi30k"
DATA_DIR_ENV = "MINITORCH_MT_DATA"

DEFAULT_CACHE_DIR = Path("~/.cache/minitorch/multi30k")
CACHE_DIR_ENV = "MINITORCH_MT_CACHE"

DEFAULT_BASE_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/"
    "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw"
)
BASE_URL_ENV = "MINITORCH_MT_URL"

SPLITS = ("train", "valid", "test")
LANGUAGES = ("de", "en")
# Our split name -> the file stem used by the origin repository.
ORIGIN_STEMS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}

# SHA-256 of each file's uncompressed text (copied from shared/data/multi30k/SHA256SUMS.text).
MULTI30K_SHA256 = {
    "test.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "valid.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "valid.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
}

EOS_DE = "<eos_de>"
EOS_EN = "<eos_en>"
PAD = "<pad>"
SPECIAL_TOKENS = (EOS_DE, EOS_EN, PAD)
# The trainer assigns special tokens the first ids, in the order given.
EOS_DE_ID, EOS_EN_ID, PAD_ID = 0, 1, 2
# Special tokens plus the 256-symbol byte alphabet; BPE merges come on top.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

# Failures that mean "the origin could not be reached or did not answer", as opposed to a
# local filesystem problem, which should surface unchanged.
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError)

Pair = tuple[str, str]


class MissingDataError(FileNotFoundError):
    """The corpus is neither in the data directory nor obtainable from the network."""


class ChecksumError(ValueError):
    """A downloaded file is corrupt or does not hold the expected text."""


class CorpusError(ValueError):
    """A corpus file that cannot be used (empty, unreadable, not line-aligned with its partner)."""


# ----------------------------------------------------------------------------------------------
# Locations


def resolve_data_dir(cli_value: str | os.PathLike | None = None) -> Path:
    """The corpus directory: ``cli_value`` if given, else ``$MINITORCH_MT_DATA`` if set,
    else ``DEFAULT_DATA_DIR`` (``../shared/data/multi30k`` relative to the project root)."""
    value = cli_value if cli_value is not None else os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(value).expanduser().absolute()


def resolve_cache_dir(value: str | os.PathLike | None = None) -> Path:
    """The download cache: ``value`` if given, else ``$MINITORCH_MT_CACHE`` if set,
    else ``~/.cache/minitorch/multi30k``."""
    chosen = value if value is not None else os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
    return Path(chosen).expanduser().absolute()


def resolve_base_url(value: str | None = None) -> str:
    """The download origin (a URL prefix holding the origin's file names): ``value`` if given,
    else ``$MINITORCH_MT_URL`` if set, else the pinned multi30k/dataset commit on GitHub."""
    chosen = value if value is not None else os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    return chosen.rstrip("/")


def expected_files() -> list[str]:
    """The six corpus file names (each may also be present as ``<name>.gz``)."""
    return [f"{split}.{lang}" for split in SPLITS for lang in LANGUAGES]


def find_corpus_file(data_dir: str | os.PathLike, name: str) -> Path | None:
    """``data_dir/name`` if it exists, else ``data_dir/name.gz`` if that exists, else None.
    The plain file wins when both are present."""
    for candidate in (Path(data_dir) / name, Path(data_dir) / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def missing_files(data_dir: str | os.PathLike) -> list[str]:
    """The expected file names present in ``data_dir`` in neither form."""
    return [name for name in expected_files() if find_corpus_file(data_dir, name) is None]


# ----------------------------------------------------------------------------------------------
# Reading


def _read_text_bytes(path: Path) -> bytes:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read()


def text_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of the uncompressed content of a plain or ``.gz`` file."""
    return hashlib.sha256(_read_text_bytes(Path(path))).hexdigest()


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, plain or ``.gz``, with only the line ending removed
    (``\\n`` or ``\\r\\n``; other whitespace is kept). A final line ending is optional.
    Raises CorpusError naming the file when it is not valid gzip or UTF-8."""
    try:
        text = _read_text_bytes(Path(path)).decode("utf-8")
    except (gzip.BadGzipFile, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise CorpusError(f"{path} is not readable UTF-8 text ({type(err).__name__}: {err})") from None
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_split(data_dir: str | os.PathLike, split: str) -> list[Pair]:
    """The ``(german, english)`` pairs of one split; line i of the .de file pairs with line i
    of the .en file. Raises CorpusError naming the file when one is empty or the two differ in
    line count."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    paths = []
    for lang in LANGUAGES:
        path = find_corpus_file(data_dir, f"{split}.{lang}")
        if path is None:
            raise MissingDataError(
                f"{Path(data_dir)} has neither {split}.{lang} nor {split}.{lang}.gz"
            )
        paths.append(path)
    de_lines, en_lines = (read_lines(path) for path in paths)
    for path, lines in zip(paths, (de_lines, en_lines)):
        if not lines:
            raise CorpusError(f"{path} is empty: the {split} split needs one sentence per line")
    if len(de_lines) != len(en_lines):
        raise CorpusError(
            f"{paths[0]} has {len(de_lines)} lines but {paths[1]} has {len(en_lines)}; "
            "the two sides of a split must be line-aligned translations"
        )
    return list(zip(de_lines, en_lines))


@dataclass(frozen=True)
class Corpus:
    """The three splits of a parallel corpus as ``(german, english)`` pairs."""

    directory: Path
    train: list[Pair]
    valid: list[Pair]
    test: list[Pair]


def read_corpus(data_dir: str | os.PathLike) -> Corpus:
    """Read all three splits from ``data_dir``."""
    splits = {split: read_split(data_dir, split) for split in SPLITS}
    return Corpus(directory=Path(data_dir), **splits)


# ----------------------------------------------------------------------------------------------
# Download


def _download_file(
    url: str, dest: Path, expected_sha256: str, timeout: float, progress: bool
) -> None:
    """Fetch ``url`` to ``dest`` atomically: into a temporary file beside it, verified, then
    renamed. A failed or unverified download leaves nothing behind."""
    # The temporary name keeps dest's suffix: hashing reads ".gz" files decompressed.
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{dest.name}.", suffix=f".part{dest.suffix}", dir=dest.parent
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            size = response.headers.get("Content-Length")
            with tqdm(
                total=int(size) if size else None,
                unit="B",
                unit_scale=True,
                desc=dest.name,
                disable=not progress,
            ) as bar:
                while chunk := response.read(1 << 16):
                    out.write(chunk)
                    bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        try:
            actual = text_sha256(tmp)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise ChecksumError(f"download of {url} is not a valid gzip file ({err})") from err
        if actual != expected_sha256:
            raise ChecksumError(
                f"checksum mismatch for {url}: the uncompressed text has SHA-256 {actual}, "
                f"expected {expected_sha256}; the download was discarded"
            )
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def download_corpus(
    cache_dir: str | os.PathLike | None = None,
    base_url: str | None = None,
    checksums: Mapping[str, str] = MULTI30K_SHA256,
    timeout: float = 60.0,
    progress: bool = True,
) -> Path:
    """Download the files missing from the cache directory and return that directory.

    Each ``<split>.<lang>`` is fetched as ``{base_url}/{origin stem}.<lang>.gz`` (origin stems:
    train, val, test_2016_flickr), stored as ``<split>.<lang>.gz`` and accepted only if the
    SHA-256 of its uncompressed text equals ``checksums[<split>.<lang>]`` (ChecksumError
    otherwise). Network failures propagate as urllib/http/socket errors.
    """
    cache = resolve_cache_dir(cache_dir)
    url_prefix = resolve_base_url(base_url)
    cache.mkdir(parents=True, exist_ok=True)
    for name in missing_files(cache):
        split, lang = name.split(".")
        url = f"{url_prefix}/{ORIGIN_STEMS[split]}.{lang}.gz"
        _download_file(url, cache / f"{name}.gz", checksums[name], timeout, progress)
    return cache


def _missing_message(data_dir: Path, cache: Path, base_url: str, reason: str) -> str:
    where = (
        f"{data_dir} lacks {', '.join(missing_files(data_dir))}"
        if data_dir.is_dir()
        else f"{data_dir} does not exist"
    )
    return (
        f"Multi30k corpus not found: {where}. Expected files in that directory: "
        f"{', '.join(expected_files())} (each plain text or .gz). "
        f"Fetching them from {base_url} into {cache}: {reason}. "
        f"To fix: pass --data-dir or set {DATA_DIR_ENV} to a directory holding these files, "
        f"or, with network access, pass --download to fetch them into the cache "
        f"({CACHE_DIR_ENV} sets the cache, {BASE_URL_ENV} a mirror)."
    )


def load_corpus(
    data_dir: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    base_url: str | None = None,
    checksums: Mapping[str, str] = MULTI30K_SHA256,
    download: bool = False,
    timeout: float = 60.0,
    progress: bool = True,
) -> Corpus:
    """The corpus from the data directory when complete, else from the download cache
    (downloading what is missing only when ``download`` is true: no network access otherwise). Files found locally are read
    as they are (a user may supply another corpus); downloads are checksummed.

    ``data_dir``, ``cache_dir`` and ``base_url`` default as ``resolve_data_dir``,
    ``resolve_cache_dir`` and ``resolve_base_url`` say. Raises MissingDataError, naming the
    directory, the expected files and the fix, when the corpus cannot be found or fetched,
    and ChecksumError when a download does not match ``checksums``.
    """
    directory = resolve_data_dir(data_dir)
    if not missing_files(directory):
        return read_corpus(directory)
    cache = resolve_cache_dir(cache_dir)
    if not missing_files(cache):
        return read_corpus(cache)
    url_prefix = resolve_base_url(base_url)
    if not download:
        raise MissingDataError(
            _missing_message(directory, cache, url_prefix, "not attempted (downloading is off)")
        )
    try:
        download_corpus(cache, url_prefix, checksums, timeout, progress)
    except _NETWORK_ERRORS as err:
        raise MissingDataError(
            _missing_message(directory, cache, url_prefix, f"the download failed ({err})")
        ) from err
    return read_corpus(cache)


# ----------------------------------------------------------------------------------------------
# Tokenizer


def _check_special_ids(tokenizer: Tokenizer, origin: str) -> None:
    for token, expected in zip(SPECIAL_TOKENS, (EOS_DE_ID, EOS_EN_ID, PAD_ID)):
        if tokenizer.token_to_id(token) != expected:
            raise ValueError(
                f"{origin}: special token {token} has id {tokenizer.token_to_id(token)}, "
                f"expected {expected}"
            )


def train_tokenizer(pairs: Sequence[Pair], vocab_size: int = 8000) -> Tokenizer:
    """A byte-level BPE tokenizer trained on both sides of ``pairs`` (one shared vocabulary
    of at most ``vocab_size`` tokens; fewer when the text supports fewer merges).

    Special tokens get fixed ids: ``<eos_de>`` = 0, ``<eos_en>`` = 1, ``<pad>`` = 2. The
    ByteLevel pre-tokenizer (no added prefix space) and decoder make decode(encode(s)) == s.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size {vocab_size} is below {MIN_VOCAB_SIZE} "
            f"(the {len(SPECIAL_TOKENS)} special tokens plus the 256-byte alphabet)"
        )
    if not pairs:
        raise ValueError("cannot train a tokenizer on zero pairs")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = (text for pair in pairs for text in pair)
    tokenizer.train_from_iterator(texts, trainer, length=2 * len(pairs))
    # Sentences that happen to contain "<eos_de>" etc. stay text, never special ids.
    tokenizer.encode_special_tokens = True
    _check_special_ids(tokenizer, "trained tokenizer")
    return tokenizer


def tokenizer_path(out_dir: str | os.PathLike, vocab_size: int) -> Path:
    """Where the tokenizer of a given vocabulary size is kept in an output directory."""
    return Path(out_dir) / f"tokenizer-bpe{vocab_size}.json"


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """A tokenizer saved by ``load_or_train_tokenizer``, its special-token ids checked."""
    tokenizer = Tokenizer.from_file(str(path))
    # Not part of the JSON format, so it is set again after loading.
    tokenizer.encode_special_tokens = True
    _check_special_ids(tokenizer, str(path))
    return tokenizer


def load_or_train_tokenizer(
    out_dir: str | os.PathLike, train_pairs: Sequence[Pair], vocab_size: int = 8000
) -> Tokenizer:
    """The tokenizer saved in ``out_dir`` for this vocabulary size, or a new one trained on
    ``train_pairs`` and saved there atomically, so a resumed run tokenizes identically."""
    path = tokenizer_path(out_dir, vocab_size)
    if path.is_file():
        return load_tokenizer(path)
    tokenizer = train_tokenizer(train_pairs, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        tokenizer.save(tmp_name)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return tokenizer


# ----------------------------------------------------------------------------------------------
# Sequences and batches


@dataclass(frozen=True)
class EncodedPairs:
    """Token sequences ``de <eos_de> en <eos_en>`` (int64 arrays) and the number of pairs
    dropped because their sequence was longer than ``max_len``."""

    sequences: list[np.ndarray]
    n_dropped: int


def encode_pairs(tokenizer: Tokenizer, pairs: Sequence[Pair], max_len: int) -> EncodedPairs:
    """Encode each pair as ``de <eos_de> en <eos_en>``.

    ``max_len`` bounds the whole sequence, so the model sees at most ``max_len - 1`` input
    positions (inputs are the sequence without its last token). A pair that does not fit is
    dropped, not truncated: a cut German side or an English side without its ``<eos_en>``
    would teach wrong translations. The count is reported in ``n_dropped``.
    """
    if max_len < 3:
        raise ValueError(f"max_len must be at least 3, got {max_len}")
    de = tokenizer.encode_batch([pair[0] for pair in pairs], add_special_tokens=False)
    en = tokenizer.encode_batch([pair[1] for pair in pairs], add_special_tokens=False)
    sequences = []
    for de_enc, en_enc in zip(de, en):
        ids = de_enc.ids + [EOS_DE_ID] + en_enc.ids + [EOS_EN_ID]
        if len(ids) <= max_len:
            sequences.append(np.array(ids, dtype=np.int64))
    return EncodedPairs(sequences=sequences, n_dropped=len(pairs) - len(sequences))


@dataclass(frozen=True)
class Batch:
    """One padded batch. ``tokens[b, t]`` is the model input, ``targets[b, t]`` the token to
    predict there (the next one), and ``weights[b, t]`` is 1.0 exactly where that target is an
    English token or the final ``<eos_en>``, else 0.0 (German side, ``<eos_de>``, padding)."""

    tokens: np.ndarray
    targets: np.ndarray
    weights: np.ndarray

    @property
    def n_targets(self) -> int:
        """Number of weighted target tokens (for token-weighted loss averages)."""
        return int(self.weights.sum())


def _source_end(seq: np.ndarray, index: int) -> int:
    """Position of ``<eos_de>`` in a well-formed sequence ``de <eos_de> en <eos_en>``."""
    if seq.ndim != 1 or len(seq) < 2 or seq[-1] != EOS_EN_ID:
        raise ValueError(
            f"sequence {index} must be 1-D, at least 2 tokens long and end with <eos_en> "
            f"(id {EOS_EN_ID}); got {seq.tolist()}"
        )
    eos_de = np.flatnonzero(seq == EOS_DE_ID)
    if len(eos_de) != 1 or np.count_nonzero(seq == EOS_EN_ID) != 1 or PAD_ID in seq:
        raise ValueError(
            f"sequence {index} must hold exactly one <eos_de> (id {EOS_DE_ID}), one final "
            f"<eos_en> (id {EOS_EN_ID}) and no <pad> (id {PAD_ID}); got {seq.tolist()}"
        )
    return int(eos_de[0])


def make_batch(sequences: Sequence[Sequence[int]]) -> Batch:
    """Pad sequences ``de <eos_de> en <eos_en>`` into a Batch of width ``max(len) - 1``.

    For a sequence ``s`` of length L with ``<eos_de>`` at position k, row b holds
    ``tokens[b, :L-1] = s[:-1]``, ``targets[b, :L-1] = s[1:]`` and ``weights[b, k:L-1] = 1``:
    from the ``<eos_de>`` input on, every prediction is an English token or ``<eos_en>``.
    Positions past L-1 are ``<pad>`` in tokens and targets with weight 0; with right padding
    and causal attention, real positions never attend to them, so no padding mask is needed.
    """
    if not sequences:
        raise ValueError("cannot make a batch of zero sequences")
    arrays = [np.asarray(seq, dtype=np.int64) for seq in sequences]
    width = max(len(seq) for seq in arrays) - 1
    tokens = np.full((len(arrays), width), PAD_ID, dtype=np.int64)
    targets = np.full((len(arrays), width), PAD_ID, dtype=np.int64)
    weights = np.zeros((len(arrays), width), dtype=np.float32)
    for row, seq in enumerate(arrays):
        source_end = _source_end(seq, row)
        n = len(seq) - 1
        tokens[row, :n] = seq[:-1]
        targets[row, :n] = seq[1:]
        weights[row, source_end:n] = 1.0
    return Batch(tokens=tokens, targets=targets, weights=weights)


def eval_batches(sequences: Sequence[np.ndarray], batch_size: int) -> Iterator[Batch]:
    """Batches over all sequences in a fixed order (sorted by length, so little padding),
    for validation loss. Average with ``Batch.n_targets`` to get a per-token loss."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    order = np.argsort([len(seq) for seq in sequences], kind="stable")
    for start in range(0, len(order), batch_size):
        yield make_batch([sequences[i] for i in order[start : start + batch_size]])


class Batcher:
    """Shuffled training batches with a seeded, saveable RNG for exact resume.

    Each epoch draws a random permutation of the sequences and keeps its first
    ``samples_per_epoch`` (all by default, so a capped epoch sees a fresh random subset).
    Length bucketing: the permutation is cut into windows of ``bucket_batches * batch_size``
    sequences (times the group size of ``epoch_groups``: a window holds ``bucket_batches``
    steps), each window is sorted by length (ties stay in random order) and cut into
    batches, and the batches of the epoch are shuffled. Batches therefore hold sequences of
    similar length (little padding) yet remain random; ``bucket_batches=1`` disables it. The
    last batch of an epoch may be smaller than ``batch_size``.

    ``state_dict()`` may be taken at any time; a batch that ``epoch()`` has handed out counts
    as done. ``load_state_dict()`` on a Batcher built with the same sequences and settings makes
    its next ``epoch()`` continue exactly where the saved one stood.
    """

    def __init__(
        self,
        sequences: Sequence[np.ndarray],
        batch_size: int,
        *,
        seed: int = 0,
        samples_per_epoch: int | None = None,
        bucket_batches: int = 50,
    ):
        if not sequences:
            raise ValueError("Batcher needs at least one sequence")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if bucket_batches < 1:
            raise ValueError(f"bucket_batches must be positive, got {bucket_batches}")
        if samples_per_epoch is None:
            samples_per_epoch = len(sequences)
        if not 1 <= samples_per_epoch <= len(sequences):
            raise ValueError(
                f"samples_per_epoch must be between 1 and the {len(sequences)} available "
                f"sequences, got {samples_per_epoch}"
            )
        self.sequences = list(sequences)
        self.batch_size = batch_size
        self.samples_per_epoch = samples_per_epoch
        self.bucket_batches = bucket_batches
        self._lengths = np.array([len(seq) for seq in self.sequences])
        self._rng = np.random.default_rng(seed)
        self._epoch_start_state: dict | None = None
        self._batches_done = 0
        self._resume_skip = 0
        self._epoch_group_size = 1
        self._resume_group_size: int | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-self.samples_per_epoch // self.batch_size)

    def _draw_epoch(self, group_size: int) -> list[list[np.ndarray]]:
        # Each window of bucket_batches steps (group_size batches each) is sorted by length and cut
        # into batches; runs of group_size neighbouring batches, of similar lengths, stay together
        # as one data-parallel step, and the epoch shuffles these groups (with group_size 1: the
        # batches).  A window counts steps, not batches, so the lengths of a step's neighbouring
        # batches differ as little with N processes as a batch's own lengths on one.  A step lasts
        # as long as its longest batch: in the default translation run (2 processes, padded tokens
        # of an epoch) the longest batch of a step is 3.9% above the step's mean with a window of
        # bucket_batches batches, 1.8% with this one.
        chosen = self._rng.permutation(len(self.sequences))[: self.samples_per_epoch]
        window = self.batch_size * group_size * self.bucket_batches
        groups = []
        for start in range(0, len(chosen), window):
            bucket = chosen[start : start + window]
            bucket = bucket[np.argsort(self._lengths[bucket], kind="stable")]
            batches = [bucket[i : i + self.batch_size] for i in range(0, len(bucket), self.batch_size)]
            groups.extend(batches[i : i + group_size] for i in range(0, len(batches), group_size))
        return [groups[g] for g in self._rng.permutation(len(groups))]

    def epoch(self) -> Iterator[Batch]:
        """The batches of the next epoch (drawn now, built lazily as they are consumed)."""
        return (make_batch([self.sequences[i] for i in indices]) for (indices,) in self.epoch_groups(1))

    def epoch_groups(self, size: int) -> Iterator[list[np.ndarray]]:
        """The next epoch's batches (drawn now) as arrays of sequence indices, in groups of ``size``
        (a group may be smaller at the end of the epoch's last length window): one batch for each
        of the ``size`` processes of a data-parallel step, neighbours in length so that no process
        waits long for another.  A group counts as handed out as a whole, so the state is the same
        in every process; a run resumed with another group size finishes the epoch in the order it
        was drawn in (cut into groups of the new size) and draws the next ones for it."""
        if size < 1:
            raise ValueError(f"group size must be positive, got {size}")
        self._epoch_start_state = copy.deepcopy(self._rng.bit_generator.state)
        drawn_size, self._resume_group_size = self._resume_group_size or size, None
        self._epoch_group_size = drawn_size
        groups, skip = [], self._resume_skip
        for group in self._draw_epoch(drawn_size):
            if skip < len(group):
                groups.append(group[skip:])
            skip = max(0, skip - len(group))
        if drawn_size != size:
            flat = [batch for group in groups for batch in group]
            groups = [flat[i : i + size] for i in range(0, len(flat), size)]
        self._batches_done, self._resume_skip = self._resume_skip, 0
        return self._iterate(groups)

    def _iterate(self, groups: list[list[np.ndarray]]) -> Iterator[list[np.ndarray]]:
        for group in groups:
            self._batches_done += len(group)
            yield group
        self._epoch_start_state = None
        self._batches_done = 0

    def _config(self) -> dict:
        return {
            "n_sequences": len(self.sequences),
            "batch_size": self.batch_size,
            "samples_per_epoch": self.samples_per_epoch,
            "bucket_batches": self.bucket_batches,
        }

    def state_dict(self) -> dict:
        """A JSON- and pickle-friendly snapshot: the RNG state at the start of the current
        epoch (or now, between epochs), the batches already handed out, and the settings."""
        in_epoch = self._epoch_start_state is not None
        rng_state = self._epoch_start_state if in_epoch else self._rng.bit_generator.state
        return {
            "rng_state": copy.deepcopy(rng_state),
            "batches_done": self._batches_done if in_epoch else 0,
            "group_size": self._epoch_group_size if in_epoch else 1,
            **self._config(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a snapshot from ``state_dict()``; the settings must match this Batcher."""
        saved = {key: state[key] for key in self._config()}
        if saved != self._config():
            raise ValueError(
                f"Batcher state was saved with {saved} but this Batcher has {self._config()}"
            )
        self._rng.bit_generator.state = copy.deepcopy(state["rng_state"])
        self._resume_skip = int(state["batches_done"])
        self._resume_group_size = int(state.get("group_size", 1)) if self._resume_skip else None
        self._epoch_start_state = None
        self._batches_done = 0


# ----------------------------------------------------------------------------------------------
# Greedy decoding helpers


def encode_prompts(tokenizer: Tokenizer, sources: Sequence[str], max_len: int) -> list[np.ndarray]:
    """German sources as prompts ``de <eos_de>`` (int64 arrays), for generating English.

    A source longer than ``max_len - 2`` tokens is truncated to that length, keeping room for
    ``<eos_de>`` and at least one generated token; every source must get a translation, so
    none is dropped. Truncation is reported with a warning.
    """
    if max_len < 3:
        raise ValueError(f"max_len must be at least 3, got {max_len}")
    room = max_len - 2
    prompts = []
    n_truncated = 0
    for encoding in tokenizer.encode_batch(list(sources), add_special_tokens=False):
        ids = encoding.ids
        if len(ids) > room:
            ids = ids[:room]
            n_truncated += 1
        prompts.append(np.array(ids + [EOS_DE_ID], dtype=np.int64))
    if n_truncated:
        warnings.warn(
            f"{n_truncated} of {len(prompts)} sources exceed {room} tokens "
            f"(max_len {max_len} - 2) and were truncated",
            stacklevel=2,
        )
    return prompts


def pad_prompts(prompts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad prompts with ``<pad>`` into ``ids [B, T]`` and return ``lengths [B]``.

    Batched greedy decoding with a causal model: at each step feed the buffer, read row b's
    logits at position ``lengths[b] - 1``, write the chosen token at ``lengths[b]`` (widening
    the buffer as needed) and increment ``lengths[b]``. Everything left of a row's position is
    real, so the padding to its right is never attended to.
    """
    if not prompts:
        raise ValueError("cannot pad zero prompts")
    lengths = np.array([len(prompt) for prompt in prompts], dtype=np.int64)
    ids = np.full((len(prompts), int(lengths.max())), PAD_ID, dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    return ids, lengths


def decode_translations(tokenizer: Tokenizer, generated: Iterable[Sequence[int]]) -> list[str]:
    """Detokenized English text of each row of generated ids (the tokens produced after the
    prompt), cut at the first ``<eos_en>``; other special tokens are skipped."""
    rows = []
    for ids in generated:
        row = [int(token) for token in ids]
        if EOS_EN_ID in row:
            row = row[: row.index(EOS_EN_ID)]
        rows.append(row)
    return tokenizer.decode_batch(rows, skip_special_tokens=True)
