"""The gradient pack of data-parallel training (optimizer_kernel.cu's launch_gradient_pack through
CudaKernelOps.gradient_pack): many gradients, each scaled into its slot of one flat bucket (or added
to it: the micro-batches of a step), against NumPy; more tensors than one launch's list holds, sizes
around the float4 tail and chunk edges, slots 4 bytes off a 16-byte boundary (the scalar path), and
a one-process DistributedDataParallel round on CUDA whose .grad views hold the weighted gradients."""

import numpy as np
import pytest

import minitorch
from minitorch.cuda.optimizer import CHUNK, MAX_TENSORS
from minitorch.tensor_data import TensorData

torch = pytest.importorskip("torch")

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
SIZES = [1, 3, 4, 5, 4099, CHUNK - 1, CHUNK + 3, 3 * CHUNK]


@pytest.mark.parametrize("offset", [0, 1])
def test_pack_scales_every_gradient_into_its_slot(offset: int) -> None:
    rng = np.random.default_rng(offset)
    sizes = [SIZES[i % len(SIZES)] for i in range(MAX_TENSORS + 7)]  # two launches
    grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    bucket = minitorch.CudaKernelOps.storage_from_numpy(np.full(offset + sum(sizes), np.nan, dtype=np.float32))
    slots, start = [], offset
    for n in sizes:
        slots.append(TensorData(bucket[start : start + n], (n,)))
        start += n
    sources = [TensorData(minitorch.CudaKernelOps.storage_from_numpy(g), (len(g),)) for g in grads]
    minitorch.CudaKernelOps.gradient_pack(slots, sources, 0.375)
    out = minitorch.CudaKernelOps.storage_to_numpy(bucket)
    np.testing.assert_array_equal(out[offset:], np.concatenate(grads) * np.float32(0.375))
    minitorch.CudaKernelOps.gradient_pack(slots, sources, 0.5, accumulate=True)  # a later micro-batch
    out = minitorch.CudaKernelOps.storage_to_numpy(bucket)
    flat = np.concatenate(grads)  # x 0.5 is exact, so a fused multiply-add rounds as NumPy does
    np.testing.assert_array_equal(out[offset:], flat * np.float32(0.375) + flat * np.float32(0.5))


def test_pack_rejects_a_slot_of_another_size() -> None:
    bucket = minitorch.CudaKernelOps.storage_from_numpy(np.zeros(8, dtype=np.float32))
    grad = TensorData(minitorch.CudaKernelOps.storage_from_numpy(np.ones(5, dtype=np.float32)), (5,))
    with pytest.raises(ValueError, match=r"gradient of shape \(5,\) for a slot of shape \(4,\)"):
        minitorch.CudaKernelOps.gradient_pack([TensorData(bucket[:4], (4,))], [grad], 1.0)


def test_one_process_round_gives_weighted_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    from minitorch import distributed

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29531")):  # fmt: skip
        monkeypatch.setenv(name, value)
    distributed.init_from_torchrun("cuda")
    try:
        minitorch.manual_seed(3)
        model = minitorch.DecoderLM(n_vocab=50, n_embd=32, n_head=4, n_positions=16, n_layers=2,
                                    p_dropout=0.0, backend=CUDA)  # fmt: skip
        ddp = distributed.DistributedDataParallel(model, bucket_cap_mb=0.01)
        ddp.gradient_weight = 0.25
        tokens = minitorch.tensor_from_numpy(np.arange(24, dtype=np.float32).reshape(2, 12) % 50, backend=CUDA)
        model(tokens).sum().backward()
        got = {name: p.value.grad.to_numpy() for name, p in model.named_parameters()}
        for p in model.parameters():
            p.value.zero_grad_()
        ddp.close()
        model(tokens).sum().backward()
        for name, p in model.named_parameters():
            np.testing.assert_allclose(got[name], 0.25 * p.value.grad.to_numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    finally:
        distributed.destroy_process_group()
