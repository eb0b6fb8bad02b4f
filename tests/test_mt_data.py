"""Tests for project/translation/tokenizer.py and batches.py: the tokenizer, sequences, batches and
the prompts of decoding."""

import json

import numpy as np
import pytest
from test_mt_corpus import REAL_DATA_DIR, needs_real_corpus, synthetic_pairs

from project.translation import batches as mt_batches
from project.translation import corpus as mt_corpus
from project.translation import decode as mt_decode
from project.translation import tokenizer as mt_tokenizer
from project.translation.tokenizer import EOS_DE_ID, EOS_EN_ID, PAD_ID


@pytest.fixture(scope="module")
def tokenizer():
    return mt_tokenizer.train_tokenizer(synthetic_pairs(300), vocab_size=400)


# ---------------------------------------------------------------------------------- tokenizer


def test_special_tokens_have_fixed_ids(tokenizer):
    for token, token_id in [("<eos_de>", 0), ("<eos_en>", 1), ("<pad>", 2)]:
        assert tokenizer.token_to_id(token) == token_id
    assert (EOS_DE_ID, EOS_EN_ID, PAD_ID) == (0, 1, 2)
    assert mt_tokenizer.MIN_VOCAB_SIZE < tokenizer.get_vocab_size() <= 400
    ids = tokenizer.encode("Text mit <eos_de> und <pad>", add_special_tokens=False).ids
    assert not {EOS_DE_ID, EOS_EN_ID, PAD_ID} & set(ids), "literal markers stay text"


def test_tokenizer_round_trip_synthetic(tokenizer):
    for text in ["Die schöne Straße über der Brücke.", "Grüße, Öl & Ärger!  ", "naïve café €5",
                 "Ein Mädchen läuft."]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == text


@needs_real_corpus
def test_tokenizer_round_trip_real_sentences_with_umlauts():
    corpus = mt_corpus.load_corpus(REAL_DATA_DIR, download=False)
    tok = mt_tokenizer.train_tokenizer(corpus.train[:2000], vocab_size=2000)
    umlaut = [de for de, _ in corpus.valid if any(c in de for c in "äöüßÄÖÜ")]
    assert len(umlaut) > 100
    encodings = tok.encode_batch(umlaut + [en for _, en in corpus.valid[:100]],
                                 add_special_tokens=False)
    decoded = tok.decode_batch([e.ids for e in encodings])
    assert decoded == umlaut + [en for _, en in corpus.valid[:100]]


def test_load_or_train_tokenizer_saves_and_reloads(tmp_path):
    pairs = synthetic_pairs(100)
    first = mt_tokenizer.load_or_train_tokenizer(tmp_path / "out", pairs, vocab_size=350)
    path = mt_tokenizer.tokenizer_path(tmp_path / "out", 350)
    assert path.is_file() and path.name == "tokenizer-bpe350.json"
    assert [p.name for p in (tmp_path / "out").iterdir()] == [path.name]
    reloaded = mt_tokenizer.load_or_train_tokenizer(tmp_path / "out", [], vocab_size=350)
    assert reloaded.get_vocab() == first.get_vocab()
    text = "Zwei Jungen fahren über die Brücke <eos_en>"
    assert (reloaded.encode(text, add_special_tokens=False).ids
            == first.encode(text, add_special_tokens=False).ids)
    assert EOS_EN_ID not in reloaded.encode(text, add_special_tokens=False).ids


def test_tokenizer_rejects_bad_settings():
    with pytest.raises(ValueError, match="vocab_size 100 is below 259"):
        mt_tokenizer.train_tokenizer(synthetic_pairs(5), vocab_size=100)
    with pytest.raises(ValueError, match="zero pairs"):
        mt_tokenizer.train_tokenizer([], vocab_size=300)


# ---------------------------------------------------------------------- sequences and batches


def test_batch_layout_on_hand_built_sequences():
    sequences = [[10, 11, EOS_DE_ID, 20, 21, EOS_EN_ID], [12, EOS_DE_ID, 22, EOS_EN_ID]]
    batch = mt_batches.make_batch(sequences)
    np.testing.assert_array_equal(batch.tokens, [[10, 11, 0, 20, 21], [12, 0, 22, 2, 2]])
    np.testing.assert_array_equal(batch.targets, [[11, 0, 20, 21, 1], [0, 22, 1, 2, 2]])
    np.testing.assert_array_equal(batch.weights, [[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    assert batch.tokens.dtype == np.int64 and batch.targets.dtype == np.int64
    assert batch.weights.dtype == np.float32
    assert batch.n_targets == 5


def test_padding_and_empty_sides():
    sequences = [[EOS_DE_ID, EOS_EN_ID], [5, 6, 7, EOS_DE_ID, 8, EOS_EN_ID]]
    batch = mt_batches.make_batch(sequences)
    assert batch.tokens.shape == (2, 5)
    np.testing.assert_array_equal(batch.tokens[0], [0, 2, 2, 2, 2])
    np.testing.assert_array_equal(batch.targets[0], [1, 2, 2, 2, 2])
    np.testing.assert_array_equal(batch.weights[0], [1, 0, 0, 0, 0])
    assert (batch.weights[batch.targets == PAD_ID] == 0).all()


@pytest.mark.parametrize("bad", [[5, EOS_EN_ID], [5, EOS_DE_ID, 6],
                                 [EOS_DE_ID, EOS_DE_ID, EOS_EN_ID],
                                 [5, EOS_DE_ID, PAD_ID, EOS_EN_ID], [EOS_EN_ID]])
def test_make_batch_rejects_malformed_sequences(bad):
    with pytest.raises(ValueError, match="sequence 1"):
        mt_batches.make_batch([[EOS_DE_ID, EOS_EN_ID], bad])


def test_encode_pairs_layout_and_dropping(tokenizer):
    pairs = [("Ein Mädchen läuft.", "A girl runs."), ("Zwei Hunde", "two dogs"),
             (" ".join(["Straße"] * 40), "street")]
    encoded = mt_batches.encode_pairs(tokenizer, pairs, max_len=30)
    assert encoded.n_dropped == 1 and len(encoded.sequences) == 2
    for (de, en), seq in zip(pairs, encoded.sequences):
        de_ids = tokenizer.encode(de, add_special_tokens=False).ids
        en_ids = tokenizer.encode(en, add_special_tokens=False).ids
        assert seq.tolist() == de_ids + [EOS_DE_ID] + en_ids + [EOS_EN_ID]
    batch = mt_batches.make_batch(encoded.sequences)
    first = encoded.sequences[0]
    weighted_targets = batch.targets[0][batch.weights[0] == 1].tolist()
    assert weighted_targets == tokenizer.encode("A girl runs.").ids + [EOS_EN_ID]
    assert len(first) <= 30
    with pytest.raises(ValueError, match="max_len must be at least 3"):
        mt_batches.encode_pairs(tokenizer, pairs, max_len=2)


def numbered_sequences(n: int) -> list[np.ndarray]:
    """Sequence i starts with token 3 + i (its identity) and has a length that varies with i."""
    return [np.array([3 + i] + [7] * (i % 11) + [EOS_DE_ID, 8, EOS_EN_ID]) for i in range(n)]


def epoch_ids(batcher) -> list[list[int]]:
    return [(batch.tokens[:, 0] - 3).tolist() for batch in batcher.epoch()]


def test_batcher_epochs_cover_data_and_are_seeded():
    sequences = numbered_sequences(103)
    a = mt_batches.Batcher(sequences, batch_size=8, seed=7, bucket_batches=4)
    b = mt_batches.Batcher(sequences, batch_size=8, seed=7, bucket_batches=4)
    c = mt_batches.Batcher(sequences, batch_size=8, seed=8, bucket_batches=4)
    a1, a2 = epoch_ids(a), epoch_ids(a)
    assert len(a) == 13 and len(a1) == 13
    assert sorted(i for batch in a1 for i in batch) == list(range(103))
    assert sorted(i for batch in a2 for i in batch) == list(range(103))
    assert sorted(len(batch) for batch in a1) == [7] + [8] * 12
    assert a1 != a2
    assert [a1, a2] == [epoch_ids(b), epoch_ids(b)]
    assert epoch_ids(c) != a1


def test_batcher_bucketing_reduces_padding_and_samples_per_epoch():
    sequences = numbered_sequences(400)

    def pad_fraction(batcher):
        batches = list(batcher.epoch())
        padding = sum((b.tokens == PAD_ID).sum() for b in batches)
        return padding / sum(b.tokens.size for b in batches)

    bucketed = mt_batches.Batcher(sequences, batch_size=16, seed=0, bucket_batches=10)
    plain = mt_batches.Batcher(sequences, batch_size=16, seed=0, bucket_batches=1)
    assert pad_fraction(bucketed) < 0.5 * pad_fraction(plain)

    capped = mt_batches.Batcher(sequences, batch_size=16, seed=0, samples_per_epoch=50)
    first, second = epoch_ids(capped), epoch_ids(capped)
    assert len(capped) == 4 and [len(batch) for batch in first].count(16) == 3
    seen_first = {i for batch in first for i in batch}
    assert len(seen_first) == 50
    assert seen_first != {i for batch in second for i in batch}
    with pytest.raises(ValueError, match="samples_per_epoch must be between 1 and the 400"):
        mt_batches.Batcher(sequences, batch_size=16, samples_per_epoch=401)


def test_a_length_window_holds_bucket_batches_steps_of_any_group_size():
    """96 sequences, batches of 8, 3 steps per window: with groups of 4 batches the epoch is one
    window, so the groups sorted by their shortest sequence do not overlap in length; with groups
    of 2 it is two windows of 48 sequences."""
    lengths = np.random.default_rng(0).permutation(np.arange(96) % 24)
    sequences = [np.array([3] + [7] * int(n) + [EOS_DE_ID, 8, EOS_EN_ID]) for n in lengths]

    def ranges(group_size):
        batcher = mt_batches.Batcher(sequences, batch_size=8, seed=1, bucket_batches=3)
        spans = []
        for group in batcher.epoch_groups(group_size):
            n = [int(lengths[i]) for batch in group for i in batch]
            spans.append((min(n), max(n), len(n)))
        return sorted(spans)

    whole = ranges(4)
    assert len(whole) == 3 and all(hi <= lo for (_, hi, _), (lo, _, _) in zip(whole, whole[1:]))
    halves = ranges(2)
    assert len(halves) == 6 and sum(n for *_, n in halves) == 96
    assert any(hi > lo for (_, hi, _), (lo, _, _) in zip(halves, halves[1:]))


def test_batcher_resume_mid_epoch_and_between_epochs():
    sequences = numbered_sequences(90)
    original = mt_batches.Batcher(sequences, batch_size=8, seed=3, samples_per_epoch=80)
    epoch_ids(original)
    between = json.loads(json.dumps(original.state_dict()))
    it = original.epoch()
    head = [next(it).tokens for _ in range(3)]
    mid = json.loads(json.dumps(original.state_dict()))
    assert mid["batches_done"] == 3
    tail = [batch.tokens for batch in it]
    following = [batch.tokens for batch in original.epoch()]

    resumed = mt_batches.Batcher(sequences, batch_size=8, seed=999, samples_per_epoch=80)
    resumed.load_state_dict(mid)
    resumed_tail = [batch.tokens for batch in resumed.epoch()]
    resumed_following = [batch.tokens for batch in resumed.epoch()]
    assert len(resumed_tail) == len(tail) == 7
    for got, want in zip(resumed_tail + resumed_following, tail + following):
        np.testing.assert_array_equal(got, want)

    restarted = mt_batches.Batcher(sequences, batch_size=8, seed=999, samples_per_epoch=80)
    restarted.load_state_dict(between)
    for got, want in zip([b.tokens for b in restarted.epoch()], head + tail):
        np.testing.assert_array_equal(got, want)
    assert restarted.state_dict()["batches_done"] == 0

    other = mt_batches.Batcher(sequences, batch_size=4, seed=3, samples_per_epoch=80)
    with pytest.raises(ValueError, match="Batcher state was saved with"):
        other.load_state_dict(mid)


def test_eval_batches_fixed_order_covers_everything():
    sequences = numbered_sequences(37)
    batches = list(mt_batches.eval_batches(sequences, batch_size=10))
    assert [len(b.tokens) for b in batches] == [10, 10, 10, 7]
    ids = [i for b in batches for i in (b.tokens[:, 0] - 3).tolist()]
    assert sorted(ids) == list(range(37))
    lengths = [len(sequences[i]) for i in ids]
    assert lengths == sorted(lengths)
    assert sum(b.n_targets for b in batches) == 2 * 37


# ------------------------------------------------------------------------------ greedy decoding


def test_prompts_padding_and_decoding(tokenizer):
    sources = ["Ein Mädchen läuft über die Straße.", "Zwei Hunde"]
    prompts = mt_tokenizer.encode_prompts(tokenizer, sources, max_len=40)
    for source, prompt in zip(sources, prompts):
        source_ids = tokenizer.encode(source, add_special_tokens=False).ids
        assert prompt.tolist() == source_ids + [EOS_DE_ID]
    ids, lengths = mt_decode.pad_prompts(prompts)
    assert lengths.tolist() == [len(p) for p in prompts]
    assert ids.shape == (2, max(lengths))
    np.testing.assert_array_equal(ids[1, : lengths[1]], prompts[1])
    assert (ids[1, lengths[1]:] == PAD_ID).all()

    english = ["A girl runs across the street.", "two dogs, café"]
    generated = [tokenizer.encode(english[0]).ids + [EOS_EN_ID, 57, 58],
                 np.array([PAD_ID] + tokenizer.encode(english[1]).ids + [EOS_EN_ID])]
    assert mt_tokenizer.decode_translations(tokenizer, generated) == english
    assert mt_tokenizer.decode_translations(tokenizer, [[]]) == [""]


def test_prompt_truncation_warns(tokenizer):
    long_source = " ".join(["Straße"] * 30)
    with pytest.warns(UserWarning, match="1 of 2 sources exceed 8 tokens"):
        prompts = mt_tokenizer.encode_prompts(tokenizer, [long_source, "Hunde"], max_len=10)
    assert len(prompts[0]) == 9 and prompts[0][-1] == EOS_DE_ID
