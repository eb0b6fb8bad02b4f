"""The Multi30k German->English corpus of the translation program: where it lives, reading its
splits, and fetching it.

``load_corpus`` finds ``{train,valid,test}.{de,en}`` (plain or ``.gz``) in the data directory or
the download cache; only when asked (``download=True``) does it fetch missing files from the
corpus's public origin into the cache, checked against SHA-256 checksums of the uncompressed text.
The tokenizer (tokenizer.py) and the batches (batches.py) come next.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import urllib.error
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from minitorch.serialization import atomic_write

PROJECT_ROOT = Path(__file__).resolve().parents[2]
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


def _uncompressed(data: bytes, name: str) -> bytes:
    """The content of a file called ``name`` whose bytes are ``data`` (gunzipped for ``.gz``)."""
    return gzip.decompress(data) if name.endswith(".gz") else data


def _read_text_bytes(path: Path) -> bytes:
    return _uncompressed(path.read_bytes(), path.name)


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
    """Fetch ``url`` into memory, verify it, then write it to ``dest`` atomically (a ``.gz``
    name: the checksum is of the uncompressed text). A failed or unverified download leaves
    nothing behind."""
    chunks = []
    with urllib.request.urlopen(url, timeout=timeout) as response:
        size = response.headers.get("Content-Length")
        with tqdm(
            total=int(size) if size else None,
            unit="B",
            unit_scale=True,
            desc=dest.name,
            disable=not progress,
        ) as bar:
            while chunk := response.read(1 << 16):
                chunks.append(chunk)
                bar.update(len(chunk))
    data = b"".join(chunks)
    try:
        actual = hashlib.sha256(_uncompressed(data, dest.name)).hexdigest()
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise ChecksumError(f"download of {url} is not a valid gzip file ({err})") from err
    if actual != expected_sha256:
        raise ChecksumError(
            f"checksum mismatch for {url}: the uncompressed text has SHA-256 {actual}, "
            f"expected {expected_sha256}; the download was discarded"
        )
    atomic_write(dest, lambda f: f.write(data))


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


def complete_directory(data_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """Where load_corpus reads the corpus from: the data directory when it holds every file, else
    the download cache when it does, else None (``data_dir`` and ``cache_dir`` default as there)."""
    for directory in (resolve_data_dir(data_dir), resolve_cache_dir(cache_dir)):
        if not missing_files(directory):
            return directory
    return None


def split_sizes(data_dir: str | os.PathLike | None = None) -> dict[str, int] | None:
    """Lines of each split's English file where load_corpus would find the corpus, None where it
    finds none or cannot read one (load_corpus then says why): the sizes a run's plan needs before
    the corpus is read and checked."""
    directory = complete_directory(data_dir)
    if directory is None:
        return None
    try:
        return {split: _read_text_bytes(find_corpus_file(directory, f"{split}.en")).count(b"\n") for split in SPLITS}
    except (OSError, EOFError, zlib.error):
        return None


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
    found = complete_directory(data_dir, cache_dir)
    if found is not None:
        return read_corpus(found)
    directory, cache = resolve_data_dir(data_dir), resolve_cache_dir(cache_dir)
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
