"""Tests for project/gpt2/model.py and project/gpt2/sample.py: llm.c layout in and out, GPT-2's
initialisation, loss and gradients against a float64 torch GPT-2 (softmax and ReLU attention),
training on a generated shard, decoding, and errors."""

import struct

import numpy as np
import pytest
import torch

import minitorch
from project.gpt2.llmc import GPT2Config, LlmcFormatError, parameter_shapes, read_checkpoint, write_shard
from project.gpt2.model import GPT2, gpt2_init_params
from project.gpt2.sample import generate, sample_token
from project.gpt2.shards import ShardLoader
from project.gpt2.training import GPT2Step

F = torch.nn.functional
CONFIG = GPT2Config(max_seq_len=16, vocab_size=60, padded_vocab_size=64, num_layers=2, num_heads=4, channels=64)
FAST = minitorch.TensorBackend(minitorch.FastOps)


def random_llmc_params(config, seed=0):
    rng = np.random.default_rng(seed)
    return {n: (0.1 * rng.standard_normal(s)).astype(np.float32) for n, s in parameter_shapes(config).items()}


def numpy_checkpoint(path, config, params):
    """llm.c's layout written by hand: header of 256 int32, then the tensors in llm.c's order."""
    c = config
    header = [20240326, 3, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels, c.padded_vocab_size]
    order = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
             "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]  # fmt: skip
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header, *[0] * 248))
        for name in order:
            np.asarray(params[name], dtype="<f4").tofile(f)
    return path


def test_numpy_written_checkpoint_loads_into_the_right_parameters(tmp_path):
    params = random_llmc_params(CONFIG, seed=1)
    model = GPT2.from_checkpoint(numpy_checkpoint(tmp_path / "m.bin", CONFIG, params), backend=FAST)
    value = lambda p: p.value.to_numpy()  # noqa: E731
    attn1 = model.layers[1].attention
    np.testing.assert_array_equal(value(model.wte.weight), params["wte"])
    np.testing.assert_array_equal(value(model.wpe.weight), params["wpe"])
    np.testing.assert_array_equal(value(attn1.qkv_projection.weight), params["qkvw"][1])
    np.testing.assert_array_equal(value(attn1.qkv_projection.bias), params["qkvb"][1])
    np.testing.assert_array_equal(value(attn1.out_projection.weight), params["attprojw"][1])
    np.testing.assert_array_equal(value(model.layers[0].ff.linear_in.weight), params["fcw"][0])
    np.testing.assert_array_equal(value(model.layers[0].ff.linear_out.weight), params["fcprojw"][0])
    np.testing.assert_array_equal(value(model.layers[0].ln_2.bias), params["ln2b"][0])
    np.testing.assert_array_equal(value(model.ln_f.weight), params["lnfw"])


def test_model_to_file_to_model_round_trip_is_exact(tmp_path):
    params = random_llmc_params(CONFIG, seed=2)
    path = numpy_checkpoint(tmp_path / "in.bin", CONFIG, params)
    model = GPT2.from_checkpoint(path, backend=FAST)
    model.save_checkpoint(tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == path.read_bytes()
    again = GPT2.from_checkpoint(tmp_path / "out.bin", backend=FAST)
    for name, value in again.llmc_params().items():
        np.testing.assert_array_equal(value, params[name], err_msg=name)


def test_fresh_model_has_gpt2_initialisation():
    config = GPT2Config(64, 200, 256, 4, 4, 128)
    p = GPT2.fresh(config, seed=3, backend=FAST).llmc_params()
    for name, value in gpt2_init_params(config, 3).items():
        np.testing.assert_array_equal(p[name], value, err_msg=name)
    for name in ("wpe", "qkvw", "fcw"):
        assert abs(p[name].std() - 0.02) < 0.001, name
    for name in ("attprojw", "fcprojw"):
        assert abs(p[name].std() - 0.02 / np.sqrt(8)) < 0.0005, name
    assert abs(p["wte"][:200].std() - 0.02) < 0.001 and not p["wte"][200:].any()
    for name in ("qkvb", "attprojb", "fcb", "fcprojb", "ln1b", "ln2b", "lnfb"):
        assert not p[name].any(), name
    for name in ("ln1w", "ln2w", "lnfw"):
        assert (p[name] == 1).all(), name
    assert not np.array_equal(p["qkvw"], GPT2.fresh(config, seed=4, backend=FAST).llmc_params()["qkvw"])


def torch_gpt2_loss(params, idx, targets, config, activation):
    """Float64 GPT-2 written from llm.c's layout (weights [out, in], qkv rows Q K V, tied head)."""
    P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    B, T = idx.shape
    C, NH, V = config.channels, config.num_heads, config.vocab_size
    x = P["wte"][torch.tensor(idx)] + P["wpe"][:T]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(config.num_layers):
        h = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], eps=1e-5)
        q, k, v = (h @ P["qkvw"][l].T + P["qkvb"][l]).split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / np.sqrt(C // NH)
        if activation == "softmax":
            att = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        else:
            att = torch.relu(scores).masked_fill(future, 0.0)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P["attprojw"][l].T + P["attprojb"][l]
        h = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], eps=1e-5)
        x = x + F.gelu(h @ P["fcw"][l].T + P["fcb"][l], approximate="tanh") @ P["fcprojw"][l].T + P["fcprojb"][l]
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], eps=1e-5)
    loss = F.cross_entropy((x @ P["wte"][:V].T).view(B * T, V), torch.tensor(targets).view(-1))
    loss.backward()
    return loss.item(), {k: t.grad.numpy() for k, t in P.items()}


@pytest.mark.parametrize(
    "activation,attention,loss_kind,recompute",
    [("softmax", "naive", "naive", False), ("relu", "naive", "naive", False), ("relu", "fused", "fused", True)],
)
def test_loss_and_gradients_match_float64_torch(activation, attention, loss_kind, recompute):
    params = gpt2_init_params(CONFIG, seed=5)
    rng = np.random.default_rng(6)
    idx, targets = rng.integers(0, CONFIG.vocab_size, (2, 2, 12))
    model = GPT2(CONFIG, backend=FAST, attention=attention, activation=activation, recompute_layers=recompute)
    model.load_llmc_params(params)
    loss = model.loss(model.token_ids(idx), model.token_ids(targets), loss_kind)
    loss.backward()
    ref_loss, ref_grads = torch_gpt2_loss(params, idx, targets, CONFIG, activation)
    assert abs(loss.item() - ref_loss) < 1e-5 * ref_loss
    for name, grad in model.llmc_grads().items():
        ref = ref_grads[name]
        assert np.abs(grad - ref).max() <= 1e-4 * np.abs(ref).max() + 1e-9, name
    assert not ref_grads["wte"][CONFIG.vocab_size :].any() and not model.llmc_grads()["wte"][CONFIG.vocab_size :].any()


def test_relu_attention_changes_the_model():
    params = gpt2_init_params(CONFIG, seed=7)
    idx = np.random.default_rng(8).integers(0, CONFIG.vocab_size, (1, 10))
    logits = {}
    for activation in ("softmax", "relu"):
        model = GPT2(CONFIG, backend=FAST, activation=activation)
        model.load_llmc_params(params)
        logits[activation] = model.next_token_logits(model.token_ids(idx))
    assert np.abs(logits["softmax"] - logits["relu"]).max() > 1e-3


def test_tiny_model_trains_on_a_generated_shard(tmp_path):
    rng = np.random.default_rng(9)
    pattern = rng.integers(0, CONFIG.vocab_size, 7)
    write_shard(tmp_path / "t_train_000000.bin", np.tile(pattern, 200))
    loader = ShardLoader(str(tmp_path / "t_train_*.bin"), 4, 16)
    model = GPT2.fresh(CONFIG, seed=10, backend=FAST, attention="fused")
    optimizer = minitorch.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, max_grad_norm=1.0)
    step = GPT2Step(model, optimizer, "fused")
    losses = [step(*loader.next_batch(), 3e-3)[0] for _ in range(6)]
    assert losses[0] > 3.5 and losses[-1] < losses[0] - 0.5, losses


def test_bf16_steps_fold_the_tied_heads_gradient_into_the_embeddings(taken_pending):
    """In every bf16 step (the working copies rewritten by AdamW, read again), the embedding's backward
    starts from the tied head's gradient, and each LayerNorm adds the residual stream's: backward
    orders the head's read of wte's working copy by this step's forward, not by the first one's."""
    model = GPT2.fresh(CONFIG, seed=12, backend=FAST, use_fused_kernel=True, attention="fused")
    step = GPT2Step(model, minitorch.AdamW(model.parameters(), lr=1e-3), "fused", dtype="bf16")
    ids = np.random.default_rng(13).integers(0, CONFIG.vocab_size, (2, 16))
    for _ in range(2):
        taken_pending.clear()
        step(ids, ids, 1e-3)
        folded = [t for t in taken_pending if t is not None]
        assert [t.shape for t in folded].count((CONFIG.padded_vocab_size, CONFIG.channels)) == 1
        assert len(folded) == 1 + 2 * CONFIG.num_layers  # the head's, and the residual's at each LayerNorm


def test_narrow_rows_are_a_view_with_gradient():
    """The tied LM head and the last positions are row ranges of wte and the hidden states: Tensor.narrow."""
    t = minitorch.tensor_from_numpy(np.arange(12.0).reshape(4, 3), backend=FAST, requires_grad=True)
    rows = t.narrow(0, 1, 2)
    np.testing.assert_array_equal(rows.to_numpy(), np.arange(3.0, 9.0).reshape(2, 3))
    (rows * rows).sum().backward()
    expected = np.zeros((4, 3))
    expected[1:3] = 2 * np.arange(3.0, 9.0).reshape(2, 3)
    np.testing.assert_array_equal(t.grad.to_numpy(), expected)
    with pytest.raises(minitorch.IndexingError, match=r"start \(3\) \+ length \(2\) exceeds size 4"):
        t.narrow(0, 3, 2)


def test_generate_greedy_and_sampled():
    model = GPT2.fresh(CONFIG, seed=11, backend=FAST)
    greedy = generate(model, [1, 2], 5, temperature=0)
    assert greedy[:2] == [1, 2] and len(greedy) == 7
    expected = [1, 2]
    for _ in range(5):
        expected.append(int(np.argmax(model.next_token_logits(model.token_ids(np.array([expected])))[0])))
    assert greedy == expected
    assert generate(model, [1, 2], 5, top_k=1) == greedy
    assert generate(model, [3], 4, top_k=5, seed=1) == generate(model, [3], 4, top_k=5, seed=1)
    long = generate(model, [0] * CONFIG.max_seq_len, 2, temperature=0)
    assert len(long) == CONFIG.max_seq_len + 2  # the context window slides


def test_sample_token_respects_top_k_and_temperature():
    logits = np.array([0.0, 5.0, 1.0, 4.0, -2.0])
    rng = np.random.default_rng(0)
    draws = {sample_token(logits, 1.0, 2, rng) for _ in range(200)}
    assert draws == {1, 3}
    assert sample_token(logits, 0.0) == 1
    cold = [sample_token(logits, 0.05, None, rng) for _ in range(50)]
    assert set(cold) == {1}
    with pytest.raises(ValueError, match="temperature"):
        sample_token(logits, -1.0)


def test_bad_inputs_give_clear_errors(tmp_path):
    model = GPT2.fresh(CONFIG, seed=12, backend=FAST)
    with pytest.raises(ValueError, match=r"token id 60 is outside \[0, 60\)"):
        model.token_ids(np.array([[1, 60]]))
    with pytest.raises(ValueError, match="sequence length 17 exceeds the model's max_seq_len 16"):
        model.token_ids(np.zeros((1, 17), dtype=np.int64))
    with pytest.raises(ValueError, match=r"\[B, T\] integer array"):
        model.token_ids(np.zeros((2, 3)))
    params = gpt2_init_params(CONFIG)
    params["fcw"] = params["fcw"][:, :-1]
    with pytest.raises(ValueError, match=r"'fcw' has shape \(2, 255, 64\), expected \(2, 256, 64\)"):
        model.load_llmc_params(params)
    with pytest.raises(ValueError, match="loss must be one of"):
        model.loss(model.token_ids(np.zeros((1, 2), dtype=int)), model.token_ids(np.zeros((1, 2), dtype=int)), "exact")
    write_shard(tmp_path / "shard.bin", [1, 2, 3])
    with pytest.raises(LlmcFormatError, match="looks like an llm.c token shard"):
        GPT2.from_checkpoint(tmp_path / "shard.bin")
    with pytest.raises(ValueError, match="at least one prompt token"):
        generate(model, [], 3)
    assert read_checkpoint(model.save_checkpoint(tmp_path / "ok.bin"))[0] == CONFIG
