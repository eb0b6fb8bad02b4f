"""Tests for project/translation/corpus.py: where the corpus lives, reading its splits, downloading it
(from a local server; no test reaches the real origin)."""

import contextlib
import gzip
import hashlib
import http.server
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from project.translation import corpus as mt_corpus

REPO_ROOT = Path(__file__).resolve().parent.parent
REAL_DATA_DIR = REPO_ROOT / ".." / "shared" / "data" / "multi30k"
needs_real_corpus = pytest.mark.skipif(
    bool(mt_corpus.missing_files(REAL_DATA_DIR)),
    reason=f"real Multi30k corpus not present at {REAL_DATA_DIR}",
)


def closed_port_url() -> str:
    """A loopback URL on a port nobody listens on: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/raw"


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch, tmp_path):
    """No test reads the user's settings or cache, or can reach the real origin."""
    monkeypatch.delenv(mt_corpus.DATA_DIR_ENV, raising=False)
    monkeypatch.setenv(mt_corpus.CACHE_DIR_ENV, str(tmp_path / "default-cache"))
    monkeypatch.setenv(mt_corpus.BASE_URL_ENV, closed_port_url())


GERMAN_WORDS = ["Ein", "Mädchen", "läuft", "über", "die", "Straße", "zwei", "Hunde", "spielen",
                "im", "Grünen", "Männer", "schöne", "Öfen", "große", "Brücke", "Jungen", "fährt"]
ENGLISH_WORDS = ["A", "girl", "runs", "across", "the", "street", "two", "dogs", "play", "in",
                 "green", "men", "nice", "ovens", "big", "bridge", "boys", "rides", "café"]


def synthetic_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)

    def sentence(words):
        return " ".join(rng.choice(words, size=rng.integers(2, 9))) + "."

    return [(sentence(GERMAN_WORDS), sentence(ENGLISH_WORDS)) for _ in range(n)]


def write_corpus(directory: Path, pairs_by_split: dict, names: dict | None = None,
                 gz: bool = True) -> dict:
    """Write each split's sides as files (optionally gzip'd, optionally under origin names);
    return the SHA-256 table of their text."""
    directory.mkdir(parents=True, exist_ok=True)
    checksums = {}
    for split, pairs in pairs_by_split.items():
        for side, lang in enumerate(mt_corpus.LANGUAGES):
            text = "".join(pair[side] + "\n" for pair in pairs).encode("utf-8")
            stem = names[split] if names else split
            path = directory / f"{stem}.{lang}{'.gz' if gz else ''}"
            path.write_bytes(gzip.compress(text) if gz else text)
            checksums[f"{split}.{lang}"] = hashlib.sha256(text).hexdigest()
    return checksums


def small_splits() -> dict:
    pairs = synthetic_pairs(30, seed=1)
    return {"train": pairs[:20], "valid": pairs[20:25], "test": pairs[25:]}


@contextlib.contextmanager
def serve_directory(root: Path, lifetime_s: float = 30.0):
    """Serve ``root`` over HTTP on 127.0.0.1 in a thread; yields (base URL, requested paths).
    The server stops when the block ends, or by itself after ``lifetime_s`` seconds."""
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

        def log_message(self, format, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    watchdog = threading.Timer(lifetime_s, server.shutdown)
    watchdog.daemon = True
    thread.start()
    watchdog.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/raw", requested
    finally:
        watchdog.cancel()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def origin(tmp_path):
    """A local origin serving a small generated corpus under the origin's file names."""
    splits = small_splits()
    checksums = write_corpus(tmp_path / "www" / "raw", splits, names=mt_corpus.ORIGIN_STEMS)
    with serve_directory(tmp_path / "www") as (url, requested):
        yield url, requested, checksums, splits



# ---------------------------------------------------------------------------------- locations


def test_resolve_data_dir_precedence(monkeypatch, tmp_path):
    assert mt_corpus.resolve_data_dir() == (REPO_ROOT.parent / "shared/data/multi30k").absolute()
    assert mt_corpus.DEFAULT_DATA_DIR == REPO_ROOT.parent / "shared" / "data" / "multi30k"
    monkeypatch.setenv(mt_corpus.DATA_DIR_ENV, str(tmp_path / "env"))
    assert mt_corpus.resolve_data_dir() == tmp_path / "env"
    assert mt_corpus.resolve_data_dir(tmp_path / "cli") == tmp_path / "cli"


def test_resolve_cache_dir_and_base_url(monkeypatch, tmp_path):
    monkeypatch.delenv(mt_corpus.CACHE_DIR_ENV)
    monkeypatch.delenv(mt_corpus.BASE_URL_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert mt_corpus.resolve_cache_dir() == tmp_path / ".cache" / "minitorch" / "multi30k"
    assert mt_corpus.resolve_cache_dir(tmp_path / "c") == tmp_path / "c"
    assert mt_corpus.resolve_base_url() == (
        "https://raw.githubusercontent.com/multi30k/dataset/"
        "a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw"
    )
    monkeypatch.setenv(mt_corpus.BASE_URL_ENV, "http://mirror.example/raw/")
    assert mt_corpus.resolve_base_url() == "http://mirror.example/raw"
    assert mt_corpus.resolve_base_url("http://other/x") == "http://other/x"


# ------------------------------------------------------------------------------------ reading


def test_read_lines_plain_and_gz_keep_all_but_newline(tmp_path):
    text = "Grüße aus Köln \nzweite\tZeile\r\n\nletzte ohne Umbruch"
    expected = ["Grüße aus Köln ", "zweite\tZeile", "", "letzte ohne Umbruch"]
    (tmp_path / "a.txt").write_bytes(text.encode("utf-8"))
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    assert mt_corpus.read_lines(tmp_path / "a.txt") == expected
    assert mt_corpus.read_lines(tmp_path / "a.txt.gz") == expected
    (tmp_path / "empty").write_bytes(b"")
    assert mt_corpus.read_lines(tmp_path / "empty") == []


def test_read_corpus_mixed_forms(tmp_path):
    splits = small_splits()
    write_corpus(tmp_path, {"train": splits["train"]}, gz=False)
    write_corpus(tmp_path, {"valid": splits["valid"], "test": splits["test"]}, gz=True)
    (tmp_path / "train.de.gz").write_bytes(gzip.compress(b"ignored: the plain file wins\n"))
    assert mt_corpus.missing_files(tmp_path) == []
    assert mt_corpus.find_corpus_file(tmp_path, "train.de") == tmp_path / "train.de"
    assert mt_corpus.find_corpus_file(tmp_path, "valid.en") == tmp_path / "valid.en.gz"
    corpus = mt_corpus.load_corpus(tmp_path, download=False)
    assert corpus.directory == tmp_path
    assert (corpus.train, corpus.valid, corpus.test) == (
        splits["train"], splits["valid"], splits["test"])


def test_read_split_line_count_mismatch(tmp_path):
    (tmp_path / "valid.de").write_text("eins\nzwei\ndrei\n", encoding="utf-8")
    (tmp_path / "valid.en.gz").write_bytes(gzip.compress(b"one\ntwo\n"))
    with pytest.raises(ValueError, match=r"valid\.de has 3 lines but .*valid\.en\.gz has 2"):
        mt_corpus.read_split(tmp_path, "valid")
    with pytest.raises(ValueError, match="unknown split"):
        mt_corpus.read_split(tmp_path, "dev")


def test_read_split_names_an_empty_or_unreadable_file(tmp_path):
    (tmp_path / "test.de").write_text("eins\n", encoding="utf-8")
    (tmp_path / "test.en").write_bytes(b"")
    with pytest.raises(mt_corpus.CorpusError, match=r"test\.en is empty: the test split"):
        mt_corpus.read_split(tmp_path, "test")
    (tmp_path / "test.en").write_bytes(b"\xff\xfe not utf-8\n")
    with pytest.raises(mt_corpus.CorpusError, match=r"test\.en is not readable UTF-8 text"):
        mt_corpus.read_split(tmp_path, "test")
    (tmp_path / "test.en").unlink()
    (tmp_path / "test.en.gz").write_bytes(b"not gzip at all")
    with pytest.raises(mt_corpus.CorpusError, match=r"test\.en\.gz is not readable UTF-8 text \(BadGzipFile"):
        mt_corpus.read_split(tmp_path, "test")


@needs_real_corpus
def test_real_corpus_slice_and_checksum_table():
    corpus = mt_corpus.load_corpus(REAL_DATA_DIR, download=False)
    assert [len(corpus.train), len(corpus.valid), len(corpus.test)] == [29000, 1014, 1000]
    assert corpus.train[0] == ("Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
                               "Two young, White males are outside near many bushes.")
    for de, en in corpus.train[:500]:
        assert de and en and "\n" not in de + en
    for name, digest in mt_corpus.MULTI30K_SHA256.items():
        assert mt_corpus.text_sha256(mt_corpus.find_corpus_file(REAL_DATA_DIR, name)) == digest


# ----------------------------------------------------------------------------------- download


def test_download_from_local_server(origin, tmp_path):
    url, requested, checksums, splits = origin
    cache = tmp_path / "cache"
    corpus = mt_corpus.load_corpus(tmp_path / "absent", cache_dir=cache, base_url=url,
                                 checksums=checksums, download=True, timeout=5, progress=False)
    assert (corpus.train, corpus.valid, corpus.test) == (
        splits["train"], splits["valid"], splits["test"])
    assert corpus.directory == cache
    assert sorted(requested) == sorted(
        f"/raw/{stem}.{lang}.gz" for stem in ("train", "val", "test_2016_flickr")
        for lang in ("de", "en"))
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        f"{name}.gz" for name in mt_corpus.expected_files())
    again = mt_corpus.load_corpus(tmp_path / "absent", cache_dir=cache, base_url=url,
                                checksums=checksums, download=True, timeout=5, progress=False)
    assert again.test == splits["test"]
    assert len(requested) == 6, "a complete cache is read, not downloaded again"


def test_download_fetches_only_missing_files_via_env(origin, tmp_path, monkeypatch):
    url, requested, checksums, splits = origin
    cache = tmp_path / "cache"
    write_corpus(cache, {"train": splits["train"]})
    monkeypatch.setenv(mt_corpus.BASE_URL_ENV, url)
    monkeypatch.setenv(mt_corpus.CACHE_DIR_ENV, str(cache))
    incomplete = tmp_path / "incomplete"
    write_corpus(incomplete, {"valid": splits["valid"]})
    corpus = mt_corpus.load_corpus(incomplete, checksums=checksums, download=True, timeout=5, progress=False)
    assert corpus.directory == cache and corpus.valid == splits["valid"]
    assert sorted(requested) == sorted(
        f"/raw/{stem}.{lang}.gz" for stem in ("val", "test_2016_flickr") for lang in ("de", "en"))


@needs_real_corpus
def test_download_of_shared_files_passes_default_checksums(tmp_path):
    raw = tmp_path / "www" / "raw"
    raw.mkdir(parents=True)
    for split, stem in mt_corpus.ORIGIN_STEMS.items():
        for lang in mt_corpus.LANGUAGES:
            source = mt_corpus.find_corpus_file(REAL_DATA_DIR, f"{split}.{lang}")
            (raw / f"{stem}.{lang}.gz").symlink_to(source.resolve())
    with serve_directory(tmp_path / "www") as (url, requested):
        corpus = mt_corpus.load_corpus(tmp_path / "absent", cache_dir=tmp_path / "cache",
                                     base_url=url, download=True, timeout=5, progress=False)
    assert len(requested) == 6
    assert [len(corpus.train), len(corpus.valid), len(corpus.test)] == [29000, 1014, 1000]


def test_download_checksum_mismatch_removes_file(origin, tmp_path):
    url, _, checksums, _ = origin
    cache = tmp_path / "cache"
    wrong = dict(checksums, **{"valid.en": "0" * 64})
    with pytest.raises(mt_corpus.ChecksumError, match=r"checksum mismatch for .*/val\.en\.gz.*"
                                                    r"expected 0{64}"):
        mt_corpus.load_corpus(tmp_path / "absent", cache_dir=cache, base_url=url,
                            checksums=wrong, download=True, timeout=5, progress=False)
    left = {p.name for p in cache.iterdir()}
    assert "valid.en.gz" not in left
    assert left <= {f"{name}.gz" for name in mt_corpus.expected_files()}, "no temporary files"


def test_download_rejects_non_gzip_payload(origin, tmp_path):
    url, _, checksums, _ = origin
    (tmp_path / "www" / "raw" / "test_2016_flickr.de.gz").write_bytes(b"<html>not found</html>")
    cache = tmp_path / "cache"
    with pytest.raises(mt_corpus.ChecksumError,
                       match=r"test_2016_flickr\.de\.gz is not a valid gzip"):
        mt_corpus.download_corpus(cache, url, checksums, timeout=5, progress=False)
    left = {p.name for p in cache.iterdir()}
    assert "test.de.gz" not in left
    assert left <= {f"{name}.gz" for name in mt_corpus.expected_files()}, "no temporary files"


def test_missing_directory_makes_no_network_attempt(tmp_path, monkeypatch):
    """By default a missing corpus is reported, never fetched: the message names the directory,
    every expected file and both fixes."""
    absent = tmp_path / "nowhere"

    def no_network(*args, **kwargs):
        raise AssertionError("load_corpus tried the network without download=True")

    monkeypatch.setattr(mt_corpus.urllib.request, "urlopen", no_network)
    with pytest.raises(mt_corpus.MissingDataError) as info:
        mt_corpus.load_corpus(absent, cache_dir=tmp_path / "cache", timeout=5, progress=False)
    message = str(info.value)
    assert f"{absent} does not exist" in message
    for name in mt_corpus.expected_files():
        assert name in message
    assert "not attempted" in message and "--download" in message
    assert "--data-dir" in message and mt_corpus.DATA_DIR_ENV in message
    assert "\n" not in message
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*"))


def test_incomplete_directory_download_disabled(tmp_path):
    (tmp_path / "train.de").write_text("x\n", encoding="utf-8")
    with pytest.raises(mt_corpus.MissingDataError,
                       match=r"lacks train\.en, valid\.de, .*downloading is off"):
        mt_corpus.load_corpus(tmp_path, download=False)


def test_origin_answering_404_is_reported(tmp_path):
    (tmp_path / "www").mkdir()
    with serve_directory(tmp_path / "www") as (url, _):
        with pytest.raises(mt_corpus.MissingDataError, match="HTTP Error 404"):
            mt_corpus.load_corpus(tmp_path / "absent", cache_dir=tmp_path / "cache",
                                base_url=url, download=True, timeout=5, progress=False)
