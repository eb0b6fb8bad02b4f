"""Smoke tests of the translation program (project/translation/main.py): a tiny model on a few hundred pairs, CPU
(the corpus and the tiny configuration: tests/mt_program.py)."""

import socket

import numpy as np
import pytest
import torch

import minitorch
from minitorch import distributed
from minitorch_testing import FAST, assert_close, t64
from mt_program import SPLIT_SIZES, TINY, assert_same_training_state, computed, load, run_until_first_save
from project.common.checkpoint import load_checkpoint
from project.common.schedule import learning_rate
from project.translation import corpus as mt_corpus
from project.translation import main as run_mt
from project.translation import options as mt_options
from project.translation import tokenizer as mt_tokenizer
from project.translation.decode import greedy_decode
from project.translation.model import build_model


def test_training_learns_and_writes_every_output(straight_run) -> None:
    history, out = straight_run["history"], straight_run["out_dir"]
    assert [r["epoch"] for r in history] == [1, 2]
    first, second = history
    assert second["train_loss"] < first["train_loss"] < np.log(300) + 0.5
    assert second["valid_loss"] < first["valid_loss"]
    for record in history:
        assert isinstance(record["bleu"], float) and 0.0 <= record["bleu"] <= 100.0
        assert record["tokens_per_s"] > 0 and record["peak_memory_mb"] > 0
    assert second["step"] == 16
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "the metrics plot of the run"
    for epoch in (1, 2):
        text = (out / f"translations_epoch{epoch}.txt").read_text()
        assert text.count("\nhyp: ") == SPLIT_SIZES["test"]
    assert (out / "tokenizer-bpe300.json").is_file()
    state = load(out)
    assert state["progress"] == {"epoch": 2, "step": 16, "partial": None}
    assert set(state) >= {"model", "optimizer", "batcher", "rng", "args"}
    assert not list(out.glob(".*part*")), "temporary checkpoint files left behind"
    assert load_checkpoint(out / "checkpoint.prev.npz", mt_options.CHECKPOINT_KIND).state["progress"]["epoch"] == 1


def test_resume_after_preemption_matches_straight_run(straight_run, corpus_dir, tmp_path, monkeypatch) -> None:
    """Stop right after epoch 1's checkpoint, resume: parameters, optimizer state and metrics equal
    the uninterrupted two-epoch run exactly (dropout RNG, batch order and schedule restored)."""
    out = tmp_path / "resumed"
    run_until_first_save(TINY + ["--epochs", "2", "--data-dir", str(corpus_dir), "--out-dir", str(out)], monkeypatch)
    assert load(out)["progress"]["epoch"] == 1

    resumed = run_mt.main(["--resume", "--out-dir", str(out), "--data-dir", str(corpus_dir)])
    straight_state, resumed_state = load(straight_run["out_dir"]), load(out)
    assert_same_training_state(straight_state, resumed_state)
    assert resumed_state["optimizer"]["t"] == straight_state["optimizer"]["t"] == 16

    assert computed(resumed["history"]) == computed(straight_run["history"])
    assert (out / "translations_epoch2.txt").read_text() == (
        straight_run["out_dir"] / "translations_epoch2.txt"
    ).read_text()


def test_resume_and_fresh_run_guard_the_output_directory(straight_run) -> None:
    out = str(straight_run["out_dir"])
    with pytest.raises(SystemExit, match=r"checkpoint\.npz exists; pass --resume"):
        run_mt.main(TINY + ["--out-dir", out])
    with pytest.raises(SystemExit, match=r"checkpoint\.npz was saved with .* asks for --n-embd 64 \(saved: 32\)"):
        run_mt.main(["--resume", "--out-dir", out, "--n-embd", "64"])


def test_batched_greedy_decoding_equals_one_sentence_at_a_time(straight_run, corpus_dir) -> None:
    """Batched, length-sorted decoding with per-row positions equals a plain loop that runs the
    full model on one growing sentence and takes numpy's argmax of its last logits."""
    out = straight_run["out_dir"]
    state = load(out)
    tokenizer = mt_tokenizer.load_tokenizer(mt_tokenizer.tokenizer_path(out, 300))
    model = build_model(state["args"], tokenizer.get_vocab_size(), FAST)
    model.load_state_dict(state["model"])
    model.eval()
    sources = [de for de, _ in mt_corpus.read_split(corpus_dir, "test")[:3]]
    prompts = mt_tokenizer.encode_prompts(tokenizer, sources, 40)
    batched = greedy_decode(model, prompts, 40, 2, FAST)
    assert not model.training, "decoding must leave the model's mode as it found it"
    for prompt, got in zip(prompts, batched):
        ids = list(prompt)
        while len(ids) < 40:
            logits = model(minitorch.tensor_from_numpy(np.array([ids]), backend=FAST)).to_numpy()
            ids.append(int(np.argmax(logits[0, -1])))
            if ids[-1] == mt_tokenizer.EOS_EN_ID:
                break
        assert got.tolist() == ids[len(prompt) :]


def test_defaults_match_the_reference_configuration() -> None:
    args = mt_options.build_parser().parse_args([])
    assert (args.n_embd, args.n_head, args.n_layers, args.vocab_size, args.dropout) == (256, 8, 4, 8000, 0.1)
    assert (args.lr, args.batch_size, args.grad_clip, args.epochs) == (1e-3, 128, 1.0, 10)
    assert args.use_fused_kernel is True and args.backend == "auto"
    assert mt_options.build_parser().parse_args(["--use-fused-kernel", "false"]).use_fused_kernel is False


def test_learning_rate_warmup_then_cosine() -> None:
    lrs = [learning_rate(s, 1e-3, 4, 20) for s in range(20)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3) and all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    assert learning_rate(12, 1e-3, 4, 20) == pytest.approx(5e-4)
    assert learning_rate(20, 1e-3, 4, 20) == pytest.approx(0.0)


@pytest.mark.parametrize("max_norm", [0.5, 100.0, None])
def test_adamw_clipped_update_matches_torch(max_norm) -> None:
    """AdamW(max_grad_norm=...) is torch's clip_grad_norm_ (with our max_norm / max(norm, max_norm)
    factor) followed by torch.optim.AdamW, over two steps, on the CPU backend."""
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (2, 2, 5)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [minitorch.Parameter(minitorch.tensor_from_numpy(x, backend=FAST)) for x in init]
    ref = [t64(x, requires_grad=True) for x in init]
    opt = minitorch.AdamW(params, lr=1e-2, weight_decay=0.1, max_grad_norm=max_norm)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    for _ in range(2):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for p, r, g in zip(params, ref, grads):
            p.value.grad = minitorch.tensor_from_numpy(g, backend=FAST)
            r.grad = t64(g)
        total = torch.sqrt(sum((r.grad**2).sum() for r in ref))
        if max_norm is not None:
            for r in ref:
                r.grad *= max_norm / max(float(total), max_norm)
        opt.step()
        ref_opt.step()
        assert_close(opt.grad_norm(), total, "norm")
        for p, r in zip(params, ref):
            assert_close(p.value, r.detach(), "parameter after the clipped update")


def test_old_checkpoint_option_names_its_new_spelling(capsys) -> None:
    """--checkpoint (gradient checkpointing) was renamed --recompute-layers; the old spelling says so."""
    with pytest.raises(SystemExit):
        mt_options.build_parser().parse_args(["--checkpoint", "true"])
    assert "--checkpoint was renamed --recompute-layers" in capsys.readouterr().err


def test_torchrun_with_one_process_equals_the_plain_run(straight_run, corpus_dir, tmp_path, monkeypatch) -> None:
    """The data-parallel path (gloo group, DistributedDataParallel, sharded steps, summed running
    sums in mid-epoch checkpoints) with one process computes exactly what the plain run computes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    out = tmp_path / "torchrun1"
    args = TINY + ["--epochs", "2", "--save-every-steps", "3", "--data-dir", str(corpus_dir), "--out-dir", str(out)]
    parallel = run_mt.main(args)
    assert not distributed.is_initialized()
    for name, value in load(straight_run["out_dir"])["model"].items():
        np.testing.assert_array_equal(load(out)["model"][name], value, err_msg=name)
    assert computed(parallel["history"]) == computed(straight_run["history"])
