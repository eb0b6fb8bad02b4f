"""Tests for project/gpt2/data.py: text -> tokenizer + llm.c token shards (train/val)."""

import gzip
import math
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from project.gpt2 import data as gpt2_data
from project.gpt2.data import build_parser, main, prepare_shards, read_documents
from project.gpt2.llmc import read_shard
from project.gpt2.shards import ShardLoader

REPO_ROOT = Path(__file__).resolve().parent.parent
MULTI30K_EN = REPO_ROOT / ".." / "shared" / "data" / "multi30k" / "train.en.gz"
WORDS = "a dog cat runs over the red green blue small big house tree near with and is on".split()


def generated_lines(count=90, seed=0):
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, rng.integers(3, 10))).capitalize() + "." for _ in range(count)]
    lines[20] = "A line that quotes <|endoftext|> as text."
    lines[7] = "Ünïcödé wörds — and émoji 🐕 too."
    return lines


@pytest.fixture
def text_file(tmp_path):
    lines = generated_lines()
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines[:40]) + "\n\n   \n" + "\n".join(lines[40:]) + "\n", encoding="utf-8")
    return path, lines


def expected_stream(tokenizer_path, documents):
    """``eot doc0 eot doc1 ...`` encoded by the saved tokenizer, one document at a time."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.encode_special_tokens = True
    eot = tokenizer.token_to_id(gpt2_data.EOT_TOKEN)
    ids = []
    for doc in documents:
        ids += [eot] + tokenizer.encode(doc, add_special_tokens=False).ids
    return np.array(ids), tokenizer


def read_split(shards):
    return np.concatenate([np.asarray(read_shard(path)) for path, _ in shards])


def test_text_file_becomes_train_and_val_shards(text_file, tmp_path):
    path, lines = text_file
    result = prepare_shards(
        path, tmp_path / "out", vocab_size=300, val_fraction=0.1, shard_size=400, progress=False
    )
    assert (result.val_documents, result.train_documents) == (9, 81)  # blank lines are not documents
    assert result.tokenizer_path == tmp_path / "out" / "corpus_tokenizer.json"
    assert result.tokenizer_path.is_file()
    assert result.eot_id == 0 and result.vocab_size <= 300

    val, tokenizer = expected_stream(result.tokenizer_path, lines[:9])
    train, _ = expected_stream(result.tokenizer_path, lines[9:])
    np.testing.assert_array_equal(read_split(result.val_shards), val)
    np.testing.assert_array_equal(read_split(result.train_shards), train)
    assert (result.val_tokens, result.train_tokens) == (val.size, train.size)
    # One end-of-text token per document: the <|endoftext|> quoted in line 20 stays text.
    assert np.count_nonzero(train == result.eot_id) == 81 and np.count_nonzero(val == result.eot_id) == 9
    # Near-equal shards, none above --shard-size, none a tiny remainder.
    sizes = [count for _, count in result.train_shards]
    assert len(sizes) == math.ceil(train.size / 400) >= 2
    assert max(sizes) <= 400 and max(sizes) - min(sizes) <= 1
    names = [p.name for p, _ in result.train_shards]
    assert names[:2] == ["corpus_train_000000.bin", "corpus_train_000001.bin"]
    # Byte-level BPE is lossless, unicode included: document 7 decodes back from the val shard.
    starts = np.flatnonzero(val == result.eot_id)
    assert tokenizer.decode(val[starts[7] + 1 : starts[8]].tolist()) == lines[7]
    loader = ShardLoader(result.train_pattern, batch_size=2, seq_len=8)
    inputs, targets = loader.next_batch()
    np.testing.assert_array_equal(inputs.ravel(), train[:16])
    np.testing.assert_array_equal(targets.ravel(), train[1:17])


def test_gzip_input_and_plugged_in_tokenizer_give_the_same_shards(text_file, tmp_path):
    path, _ = text_file
    options = dict(val_fraction=0.1, shard_size=400, progress=False)
    first = prepare_shards(path, tmp_path / "a", vocab_size=300, **options)
    gz = tmp_path / "corpus.txt.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    second = prepare_shards(gz, tmp_path / "b", tokenizer_path=first.tokenizer_path, **options)
    assert second.tokenizer_path.name == "corpus_tokenizer.json"  # .txt.gz -> corpus
    assert (second.vocab_size, second.eot_id) == (first.vocab_size, first.eot_id)
    for split in ("train_shards", "val_shards"):
        np.testing.assert_array_equal(read_split(getattr(second, split)), read_split(getattr(first, split)))


def test_read_documents_lines_paragraphs_and_max_lines(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("Title\n\nFirst para\nstill first.\n\n\nSecond para.\r\nSecond too.\n", encoding="utf-8")
    assert read_documents(path) == ["Title", "First para", "still first.", "Second para.", "Second too."]
    paragraphs = ["Title", "First para\nstill first.", "Second para.\nSecond too."]
    assert read_documents(path, "paragraph") == paragraphs
    assert read_documents(path, "paragraph", max_lines=4) == ["Title", "First para\nstill first."]
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="blank.txt: no text"):
        read_documents(tmp_path / "blank.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt: not UTF-8"):
        read_documents(tmp_path / "latin1.txt")


def test_tokenizers_that_do_not_fit_are_refused(text_file, tmp_path):
    path, _ = text_file
    vocab = {**{f"w{i}": i for i in range(70000)}, "<|endoftext|>": 70000}
    big = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    big.save(str(tmp_path / "big.json"))
    with pytest.raises(ValueError, match=r"big.json has token ids up to 70000; .*at most 65536 tokens"):
        prepare_shards(path, tmp_path / "out", tokenizer_path=tmp_path / "big.json", progress=False)
    small = Tokenizer(models.WordLevel({"w0": 0, "w1": 1}, unk_token="w0"))
    small.save(str(tmp_path / "small.json"))
    with pytest.raises(ValueError, match=r"small.json has no '<\|endoftext\|>' token; .*--eot-token"):
        prepare_shards(path, tmp_path / "out", tokenizer_path=tmp_path / "small.json", progress=False)
    with pytest.raises(ValueError, match=r"vocab_size must be in 257\.\.65536 .*got 100"):
        prepare_shards(path, tmp_path / "out", vocab_size=100, progress=False)
    assert not (tmp_path / "out").exists()


def test_earlier_outputs_need_overwrite_and_stale_shards_go(text_file, tmp_path):
    path, _ = text_file
    out = tmp_path / "out"
    many = prepare_shards(path, out, name="d", vocab_size=300, shard_size=200, progress=False)
    assert len(many.train_shards) > 2
    with pytest.raises(FileExistsError, match=r"already holds outputs named 'd'.*--overwrite"):
        prepare_shards(path, out, name="d", vocab_size=300, progress=False)
    one = prepare_shards(path, out, name="d", vocab_size=300, shard_size=10**6, overwrite=True,
                         progress=False)
    assert sorted(out.glob("d_train_*.bin")) == [one.train_shards[0][0]]
    assert one.train_tokens == many.train_tokens


def test_command_line_prints_every_file_and_count(text_file, tmp_path, capsys):
    path, _ = text_file
    result = main(["--input", str(path), "--out-dir", str(tmp_path / "cli"), "--vocab-size", "300",
                   "--shard-size", "500", "--quiet"])
    printed = capsys.readouterr().out
    assert str(result.tokenizer_path) in printed and result.train_pattern in printed
    for shard, count in result.train_shards + result.val_shards:
        assert f"{shard} {count} tokens" in printed
    assert f"{result.train_documents} documents, {result.train_tokens} tokens" in printed
    help_text = " ".join(build_parser().format_help().split())
    for default in ("8192", "0.05", "100000000", "runs/gpt2_data", "<|endoftext|>", "line"):
        assert f"(default: {default})" in help_text
    with pytest.raises(SystemExit, match="error: .*no text"):
        (tmp_path / "empty.txt").write_text("")
        main(["--input", str(tmp_path / "empty.txt"), "--out-dir", str(tmp_path / "x"), "--quiet"])


@pytest.mark.skipif(not MULTI30K_EN.is_file(), reason=f"bundled Multi30k corpus not present at {MULTI30K_EN}")
def test_multi30k_slice(tmp_path):
    result = prepare_shards(
        MULTI30K_EN, tmp_path, max_lines=200, vocab_size=1000, val_fraction=0.1, shard_size=1000,
        progress=False,
    )
    with gzip.open(MULTI30K_EN, "rt", encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(200)]
    assert (result.val_documents, result.train_documents) == (20, 180)
    val, _ = expected_stream(result.tokenizer_path, lines[:20])
    train, _ = expected_stream(result.tokenizer_path, lines[20:])
    np.testing.assert_array_equal(read_split(result.val_shards), val)
    np.testing.assert_array_equal(read_split(result.train_shards), train)
    assert result.vocab_size <= 1000 and len(result.train_shards) == math.ceil(train.size / 1000)
