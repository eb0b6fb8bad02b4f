"""Tests for project/gpt2/llmc.py and shards.py: llm.c's checkpoint and token-shard formats, ShardLoader."""

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from project.gpt2.llmc import (
    GPT2_124M,
    PARAMETER_NAMES,
    GPT2Config,
    LlmcFormatError,
    num_parameters,
    pad_vocab_size,
    parameter_shapes,
    read_checkpoint,
    read_shard,
    shard_num_tokens,
    write_checkpoint,
    write_shard,
)
from project.gpt2.shards import ShardLoader, expand_shard_pattern

TINY = GPT2Config(max_seq_len=8, vocab_size=10, padded_vocab_size=16, num_layers=2, num_heads=2, channels=4)

# The layout as the test reads llm.c's fill_in_parameter_sizes, written out independently of the module.
TINY_LAYOUT = [
    ("wte", (16, 4)), ("wpe", (8, 4)), ("ln1w", (2, 4)), ("ln1b", (2, 4)),
    ("qkvw", (2, 12, 4)), ("qkvb", (2, 12)), ("attprojw", (2, 4, 4)), ("attprojb", (2, 4)),
    ("ln2w", (2, 4)), ("ln2b", (2, 4)), ("fcw", (2, 16, 4)), ("fcb", (2, 16)),
    ("fcprojw", (2, 4, 16)), ("fcprojb", (2, 4)), ("lnfw", (4,)), ("lnfb", (4,)),
]


def random_params(config, seed=0):
    rng = np.random.default_rng(seed)
    shapes = parameter_shapes(config)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def independent_checkpoint(path, header_ints, tensors):
    """llm.c's layout by hand: 256 little-endian int32, then float32 tensors back to back."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header_ints, *[0] * (256 - len(header_ints))))
        for tensor in tensors:
            np.asarray(tensor, dtype="<f4").tofile(f)
    return path


def tiny_checkpoint_file(path, **header_changes):
    """A valid TINY checkpoint written by hand, with header entries optionally changed."""
    header = dict(magic=20240326, version=3, maxT=8, V=10, L=2, NH=2, C=4, Vp=16)
    header.update(header_changes)
    tensors = [np.zeros(shape) for _, shape in TINY_LAYOUT]
    return independent_checkpoint(path, list(header.values()), tensors)


# ----------------------------------------------------------------------------------------------
# Config and layout


def test_gpt2_124m_layout_matches_llmc():
    assert pad_vocab_size(50257) == 50304 and pad_vocab_size(128) == 128 and pad_vocab_size(129) == 256
    assert GPT2Config.with_padded_vocab(
        max_seq_len=1024, vocab_size=50257, num_layers=12, num_heads=12, channels=768
    ) == GPT2_124M
    assert num_parameters(GPT2_124M) == 124475904  # what llm.c prints for gpt2_124M.bin
    assert tuple(parameter_shapes(GPT2_124M)) == PARAMETER_NAMES
    assert list(parameter_shapes(TINY).items()) == TINY_LAYOUT


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(num_layers=0), "num_layers"),
        (dict(max_seq_len=-3), "max_seq_len"),
        (dict(channels=6, num_heads=4), "channels"),
        (dict(padded_vocab_size=8), "padded_vocab_size"),
        (dict(num_heads=2.0), "num_heads"),
    ],
)
def test_config_validation_names_the_field(changes, field):
    values = dict(max_seq_len=8, vocab_size=10, padded_vocab_size=16, num_layers=2, num_heads=2, channels=4)
    with pytest.raises(ValueError, match=f"GPT2Config.{field}"):
        GPT2Config(**{**values, **changes})


# ----------------------------------------------------------------------------------------------
# Checkpoints


@pytest.mark.parametrize("dtype, version, item_bytes", [("float32", 3, 4), ("bfloat16", 5, 2)])
def test_checkpoint_round_trip_is_exact(tmp_path, dtype, version, item_bytes):
    """Version 3 (float32) or 5 (every tensor in bfloat16, rounded to nearest even as ml_dtypes rounds):
    read back as float32 holding exactly the values written; writing them again gives the same bytes."""
    params = random_params(TINY)
    path = write_checkpoint(tmp_path / "model.bin", TINY, params, dtype=dtype)
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]  # no temporary file left behind
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[:8].tolist() == [20240326, version, 8, 10, 2, 2, 4, 16] and not header[8:].any()
    assert path.stat().st_size == 1024 + item_bytes * num_parameters(TINY)
    config, loaded = read_checkpoint(path)
    assert config == TINY and list(loaded) == list(PARAMETER_NAMES)
    stored = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    for name in PARAMETER_NAMES:
        assert loaded[name].dtype == np.float32
        np.testing.assert_array_equal(loaded[name], params[name].astype(stored).astype(np.float32))
    assert write_checkpoint(tmp_path / "again.bin", TINY, loaded, dtype=dtype).read_bytes() == path.read_bytes()


def test_bfloat16_checkpoint_widens_exactly_and_other_dtypes_are_refused(tmp_path):
    loaded = read_checkpoint(write_checkpoint(tmp_path / "bf16.bin", TINY, random_params(TINY), dtype="bfloat16"))[1]
    widened = read_checkpoint(write_checkpoint(tmp_path / "fp32.bin", TINY, loaded))[1]
    for name in PARAMETER_NAMES:
        np.testing.assert_array_equal(widened[name], loaded[name])
    with pytest.raises(ValueError, match=r"dtype is one of \['bfloat16', 'float32'\], got 'float16'"):
        write_checkpoint(tmp_path / "m.bin", TINY, loaded, dtype="float16")


def test_independently_written_checkpoint_loads_into_named_parameters(tmp_path):
    # Tensor k holds k*1000 + 0, 1, 2, ... in C order: every value tells where it came from.
    tensors = [k * 1000 + np.arange(np.prod(s)).reshape(s) for k, (_, s) in enumerate(TINY_LAYOUT)]
    path = independent_checkpoint(tmp_path / "llmc.bin", [20240326, 3, 8, 10, 2, 2, 4, 16], tensors)
    config, params = read_checkpoint(path)
    assert config == TINY
    np.testing.assert_array_equal(params["qkvb"][1], 5000 + np.arange(12, 24))  # layer 1 of [L, 3C]
    np.testing.assert_array_equal(params["lnfw"], 14000 + np.arange(4))
    np.testing.assert_array_equal(params["wpe"][3], 1000 + np.arange(12, 16))  # row 3 of [maxT, C]
    assert params["fcprojw"][0, 2, 5] == 12000 + 2 * 16 + 5  # [L, C, 4C]: out 2, in 5 of layer 0
    assert params["wte"][15, 3] == 15 * 4 + 3  # padded rows are read too


def test_independently_written_bfloat16_checkpoint_loads(tmp_path):
    """A version-5 file written by hand (ml_dtypes' bfloat16, little-endian, tensors back to back)."""
    rng = np.random.default_rng(3)
    tensors = [rng.standard_normal(shape).astype(ml_dtypes.bfloat16) for _, shape in TINY_LAYOUT]
    path = tmp_path / "llmc_bf16.bin"
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240326, 5, 8, 10, 2, 2, 4, 16, *[0] * 248))
        for tensor in tensors:
            f.write(tensor.view("<u2").tobytes())
    config, params = read_checkpoint(path)
    assert config == TINY
    for (name, _), tensor in zip(TINY_LAYOUT, tensors):
        np.testing.assert_array_equal(params[name], tensor.astype(np.float32))
    with open(path, "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(LlmcFormatError, match=r"2 bytes too many .*header says \d+ bfloat16 parameters"):
        read_checkpoint(path)


def test_write_checkpoint_checks_names_shapes_and_dtypes(tmp_path):
    params = random_params(TINY)
    with pytest.raises(ValueError, match=r"missing \['lnfb'\]"):
        write_checkpoint(tmp_path / "m.bin", TINY, {k: v for k, v in params.items() if k != "lnfb"})
    with pytest.raises(ValueError, match=r"params\['qkvw'\] has shape \(2, 4, 12\), expected \(2, 12, 4\)"):
        write_checkpoint(tmp_path / "m.bin", TINY, {**params, "qkvw": params["qkvw"].transpose(0, 2, 1)})
    with pytest.raises(ValueError, match=r"params\['wpe'\] must be a float32 numpy array, got float64"):
        write_checkpoint(tmp_path / "m.bin", TINY, {**params, "wpe": params["wpe"].astype(np.float64)})
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(magic=20240520), r"header\[0\] \(magic\) is 20240520.*token shard"),
        (dict(magic=1234), r"header\[0\] \(magic\) is 1234, expected 20240326"),
        (dict(version=5), r"\d+ bytes too many .*header says \d+ bfloat16 parameters"),
        (dict(version=4), r"header\[1\] \(version\) is 4.*only versions 3 \(float32\) and 5 \(bfloat16\)"),
        (dict(version=2), r"header\[1\] \(version\) is 2, an export from before llm.c padded the vocabulary"),
        (dict(L=0), r"GPT2Config.num_layers must be in 1\.\.\d+, got 0"),
        (dict(NH=3), r"GPT2Config.channels \(4\) must be divisible by num_heads \(3\)"),
        (dict(Vp=9), r"GPT2Config.padded_vocab_size \(9\) must be >= vocab_size \(10\)"),
        (dict(L=1), r"976 bytes too many.*header says \d+ float32 parameters"),
        (dict(L=3), r"truncated .*header says \d+ float32 parameters"),
    ],
)
def test_bad_checkpoint_header_names_file_and_field(tmp_path, changes, message):
    path = tiny_checkpoint_file(tmp_path / "bad.bin", **changes)
    with pytest.raises(LlmcFormatError, match=message) as info:
        read_checkpoint(path)
    assert str(path) in str(info.value)


def assert_each_file_rejected(folder: Path, cases: dict, read) -> None:
    """cases: file name -> (bytes, message pattern). Each file, written to folder, makes read raise
    LlmcFormatError matching its pattern and naming the file."""
    for name, (data, message) in cases.items():
        path = folder / name
        path.write_bytes(data)
        with pytest.raises(LlmcFormatError, match=message) as info:
            read(path)
        assert str(path) in str(info.value)


def test_truncated_trailing_empty_and_missing_checkpoints(tmp_path):
    good = tiny_checkpoint_file(tmp_path / "good.bin").read_bytes()
    expected = len(good)
    cases = {
        "truncated.bin": (good[:-6], rf"truncated .*\({expected} bytes with .*holds {expected - 6} bytes"),
        "trailing.bin": (good + b"\0" * 8, rf"8 bytes too many .*holds {expected + 8} bytes"),
        "empty.bin": (b"", r"empty file \(0 bytes\)"),
        "short.bin": (good[:100], r"file is 100 bytes, shorter than the 1024-byte header"),
    }
    assert_each_file_rejected(tmp_path, cases, read_checkpoint)
    with pytest.raises(FileNotFoundError, match=r"checkpoint not found: .*nowhere\.bin"):
        read_checkpoint(tmp_path / "nowhere.bin")


# ----------------------------------------------------------------------------------------------
# Token shards


def test_shard_round_trip_is_exact(tmp_path):
    tokens = np.array([0, 1, 65535, 50256, 7, 7, 300], dtype=np.int64)
    path = write_shard(tmp_path / "s.bin", tokens)
    header = np.fromfile(path, dtype="<i4", count=256)
    assert header[:3].tolist() == [20240520, 1, 7] and not header[3:].any()
    assert path.stat().st_size == 1024 + 2 * 7
    loaded = read_shard(path)
    assert loaded.dtype == np.uint16 and shard_num_tokens(path) == 7
    np.testing.assert_array_equal(loaded, tokens)


def test_write_shard_refuses_tokens_outside_uint16(tmp_path):
    with pytest.raises(ValueError, match=r"token 65536 at index 2 is outside 0\.\.65535"):
        write_shard(tmp_path / "s.bin", [1, 2, 65536])
    with pytest.raises(ValueError, match=r"token -1 at index 0"):
        write_shard(tmp_path / "s.bin", [-1, 2])
    with pytest.raises(ValueError, match="must be integers, got dtype float64"):
        write_shard(tmp_path / "s.bin", [1.0, 2.0])
    with pytest.raises(ValueError, match="non-empty 1-D"):
        write_shard(tmp_path / "s.bin", [])
    assert not list(tmp_path.iterdir())


def test_bad_shards_name_file_and_field(tmp_path):
    good = write_shard(tmp_path / "good.bin", np.arange(100)).read_bytes()
    header = np.frombuffer(good[:1024], dtype="<i4").copy()
    cases = {
        "truncated.bin": (good[:-20], r"truncated .*header says 100 tokens .*room for 90 tokens"),
        "trailing.bin": (good + b"\0\0", r"2 bytes too many .*header says 100 tokens .*room for 101 tokens"),
        "empty.bin": (b"", r"empty file"),
        "model.bin": (tiny_checkpoint_file(tmp_path / "m").read_bytes(), r"is 20240326.*GPT-2 checkpoint"),
        "version.bin": (np.r_[header[:1], 2, header[2:]].astype("<i4").tobytes() + good[1024:],
                        r"header\[1\] \(version\) is 2, expected 1"),
        "zero.bin": (np.r_[header[:2], 0, header[3:]].astype("<i4").tobytes(),
                     r"header\[2\] \(token count\) is 0"),
    }
    assert_each_file_rejected(tmp_path, cases, read_shard)
    with pytest.raises(FileNotFoundError, match="token shard not found"):
        read_shard(tmp_path / "missing.bin")


def test_expand_shard_pattern_sorts_and_names_the_pattern(tmp_path):
    for name in ("d_train_000002.bin", "d_train_000000.bin", "d_train_000001.bin", "d_val_000000.bin"):
        write_shard(tmp_path / name, [1, 2])
    found = expand_shard_pattern(tmp_path / "d_train_*.bin")
    assert [p.name for p in found] == ["d_train_000000.bin", "d_train_000001.bin", "d_train_000002.bin"]
    with pytest.raises(FileNotFoundError, match=r"no token shards match the pattern '.*nothing_\*\.bin'"):
        expand_shard_pattern(tmp_path / "nothing_*.bin")


# ----------------------------------------------------------------------------------------------
# ShardLoader


def make_shards(tmp_path, sizes):
    """Shards whose tokens are consecutive numbers across all shards, so a token is its position."""
    paths, start = [], 0
    for index, size in enumerate(sizes):
        paths.append(write_shard(tmp_path / f"s_{index:06d}.bin", np.arange(start, start + size)))
        start += size
    return paths


def test_loader_batches_are_shifted_and_walk_shards_in_order(tmp_path):
    make_shards(tmp_path, [25, 13])  # samples of B*T = 6: 4 in shard 0 (25-1 = 24), 2 in shard 1
    loader = ShardLoader(tmp_path / "s_*.bin", batch_size=2, seq_len=3)
    assert loader.num_tokens == 38 and loader.batches_per_epoch == 6
    starts = []
    for _ in range(2 * loader.batches_per_epoch):
        inputs, targets = loader.next_batch()
        assert inputs.shape == targets.shape == (2, 3) and inputs.dtype == np.int64
        np.testing.assert_array_equal(targets, inputs + 1)
        np.testing.assert_array_equal(inputs.ravel(), inputs.flat[0] + np.arange(6))
        starts.append(int(inputs.flat[0]))
    # Shard 1 starts at token 25; its last token and shard 0's token 24 are never inputs.
    assert starts == [0, 6, 12, 18, 25, 31] * 2


def test_loader_process_slices_are_disjoint_and_tile_the_single_process_batch(tmp_path):
    make_shards(tmp_path, [61, 40])
    pattern, B, T, P = tmp_path / "s_*.bin", 2, 4, 3
    ranks = [ShardLoader(pattern, B, T, process_rank=r, num_processes=P) for r in range(P)]
    whole = ShardLoader(pattern, B * P, T)
    assert {r.batches_per_epoch for r in ranks} == {whole.batches_per_epoch} == {2 + 1}
    for _ in range(5):
        parts = [r.next_batch() for r in ranks]
        inputs = np.concatenate([p[0] for p in parts])
        assert len(np.unique(inputs)) == inputs.size  # disjoint across processes
        whole_inputs, whole_targets = whole.next_batch()
        np.testing.assert_array_equal(inputs, whole_inputs)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), whole_targets)


def test_loader_state_resumes_exactly(tmp_path):
    make_shards(tmp_path, [25, 13, 19])
    reference = ShardLoader(tmp_path / "s_*.bin", 2, 3)
    expected = [reference.next_batch()[0] for _ in range(20)]
    for stop in (0, 3, 4, 6, 9, 13):
        loader = ShardLoader(tmp_path / "s_*.bin", 2, 3)
        for _ in range(stop):
            loader.next_batch()
        saved = json.loads(json.dumps(loader.state()))
        resumed = ShardLoader(tmp_path / "s_*.bin", 2, 3)
        resumed.load_state(saved)
        for step in range(stop, 20):
            np.testing.assert_array_equal(resumed.next_batch()[0], expected[step])
    loader.reset()
    np.testing.assert_array_equal(loader.next_batch()[0], expected[0])
    with pytest.raises(ValueError, match=r"'seq_len': \(3, 4\)"):
        ShardLoader(tmp_path / "s_*.bin", 2, 4).load_state(saved)
    with pytest.raises(ValueError, match="sample_index 9 is outside 0..4"):
        loader.load_state({**saved, "shard_index": 0, "sample_index": 9})


def test_loader_state_resumes_with_another_number_of_processes(tmp_path):
    make_shards(tmp_path, [61, 40])
    pattern, B, T = tmp_path / "s_*.bin", 2, 4
    two = [ShardLoader(pattern, B, T, process_rank=r, num_processes=2) for r in range(2)]
    for loader in two:
        loader.next_batch()  # one step of 2 processes: tokens 0..15 of shard 0
    saved = json.loads(json.dumps(two[0].state()))
    one = ShardLoader(pattern, B, T)
    one.load_state(saved)
    assert int(one.next_batch()[0].flat[0]) == 2 * B * T  # the next token, no batch repeated or skipped
    three = ShardLoader(pattern, B, T, process_rank=0, num_processes=3)
    three.load_state(saved)  # token 16 is inside 3-process sample 0: resume at sample 1 (token 24)
    assert (three.shard_index, three.sample_index) == (0, 1)
    assert int(three.next_batch()[0].flat[0]) == 3 * B * T


def test_loader_refuses_a_shard_shorter_than_one_batch(tmp_path):
    paths = make_shards(tmp_path, [30, 12])
    with pytest.raises(LlmcFormatError, match=r"s_000001\.bin: shard holds 12 tokens.*2\*3\*2 \+ 1 = 13"):
        ShardLoader(tmp_path / "s_*.bin", 2, 3, process_rank=1, num_processes=2)
    ShardLoader([paths[1]], 2, 3, process_rank=0, num_processes=1)  # 12 >= 2*3 + 1
    with pytest.raises(ValueError, match="process_rank"):
        ShardLoader(paths, 2, 3, process_rank=2, num_processes=2)
    with pytest.raises(FileNotFoundError, match="no token shards match"):
        ShardLoader(Path(tmp_path) / "x_*.bin", 2, 3)
