"""Fused AdamW (src/optimizer_kernel.cu) against torch.optim.AdamW in float64: minitorch.AdamW on CUDA
over several steps with weight decay, updating parameters and moments in place (their device
pointers never change), and the launcher alone on misaligned buffers (its scalar path)."""

import numpy as np
import pytest

import minitorch
from minitorch import AdamW, Parameter
from minitorch.cuda.libraries import kernel_library
from minitorch.cuda_kernel_ops import CudaKernelError

from fused_testing import on_tensors, rel_err

torch = pytest.importorskip("torch")

CUDA = minitorch.TensorBackend(minitorch.CudaKernelOps)
# A single element, sizes around the float4 tail, a matrix, and a 1M-element tensor (many blocks).
SHAPES = [(1,), (3,), (4,), (4099,), (257, 129), (1 << 20,)]
STEPS = 6
TOL = 1e-5


@pytest.mark.parametrize(
    "lr,betas,eps,weight_decay",
    [(1e-3, (0.9, 0.999), 1e-8, 1e-2), (0.05, (0.8, 0.95), 1e-6, 0.1), (3e-4, (0.9, 0.98), 1e-8, 0.0)],
)
def test_adamw_matches_torch_in_place(lr: float, betas, eps: float, weight_decay: float) -> None:
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    ours = [Parameter(minitorch.tensor_from_numpy(v, backend=CUDA)) for v in init]
    theirs = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in init]
    opt = AdamW(ours, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay)
    ref = torch.optim.AdamW(theirs, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    tensors = [p.value for p in ours]
    pointers = [p.value._tensor._storage.data_ptr() for p in ours]
    moments = None
    for step in range(STEPS):
        for p, t, s in zip(ours, theirs, SHAPES):
            g = (rng.standard_normal(s) * 10.0 ** rng.uniform(-2, 1)).astype(np.float32)
            p.value.grad = minitorch.tensor_from_numpy(g, backend=CUDA)
            t.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        ref.step()
        for i, (p, t) in enumerate(zip(ours, theirs)):
            err = rel_err(p.value.to_numpy(), t.detach().numpy())
            assert err < TOL, f"parameter {SHAPES[i]} after step {step + 1}: relative error {err:.3g}"
            assert p.value is tensors[i] and p.value._tensor._storage.data_ptr() == pointers[i]
        now = [(opt.m[i]._tensor._storage.data_ptr(), opt.v[i]._tensor._storage.data_ptr()) for i in range(len(ours))]
        assert moments is None or now == moments, "AdamW reallocated its moments"
        moments = now
    for i, t in enumerate(theirs):
        state = ref.state[t]
        assert rel_err(opt.m[i].to_numpy(), state["exp_avg"].numpy()) < TOL
        assert rel_err(opt.v[i].to_numpy(), state["exp_avg_sq"].numpy()) < TOL


def test_adamw_step_allocates_nothing_that_stays() -> None:
    rng = np.random.default_rng(1)
    params = [Parameter(minitorch.tensor_from_numpy(rng.standard_normal(s), backend=CUDA)) for s in SHAPES]
    opt = AdamW(params, lr=1e-3)
    for p in params:
        p.value.grad = minitorch.tensor_from_numpy(rng.standard_normal(p.value.shape), backend=CUDA)
    opt.step()  # allocates the moments
    torch.cuda.synchronize()
    before = minitorch.cuda_memory_stats(reset=True)["current"]
    opt.step()
    torch.cuda.synchronize()
    stats = minitorch.cuda_memory_stats()
    assert stats["current"] == before, "a step left new allocations behind"
    assert stats["peak"] == before, "a step allocated temporaries"


@pytest.mark.parametrize("n", [1, 5, 1000, 123457])
def test_launcher_scalar_path_on_misaligned_buffers(n: int) -> None:
    lib = kernel_library("optimizer_kernel")
    gen = torch.Generator(device="cuda").manual_seed(n)
    bufs = [torch.randn(n + 1, device="cuda", generator=gen) for _ in range(4)]
    bufs[3].abs_()
    p, g, m, v = (b[1:] for b in bufs)  # 4 bytes past a 16-byte boundary: the scalar kernel
    p64, g64, m64, v64 = (t.double().clone() for t in (p, g, m, v))
    lr, b1, b2, eps, wd, step = 1e-2, 0.9, 0.99, 1e-8, 0.05, 3
    stream = torch.cuda.current_stream().cuda_stream
    code = lib.launch_adamw(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), n, lr, b1, b2, eps, wd, step, stream)
    assert code == 0
    m64 = b1 * m64 + (1 - b1) * g64
    v64 = b2 * v64 + (1 - b2) * g64 * g64
    p64 = p64 * (1 - lr * wd) - (lr / (1 - b1**step)) * m64 / (v64.sqrt() / (1 - b2**step) ** 0.5 + eps)
    torch.cuda.synchronize()
    for name, out, ref in (("param", p, p64), ("exp_avg", m, m64), ("exp_avg_sq", v, v64)):
        assert rel_err(out.cpu().numpy(), ref.cpu().numpy()) < TOL, name


def test_bad_arguments_raise() -> None:
    lib = kernel_library("optimizer_kernel")
    buf = torch.zeros(8, device="cuda")
    ptr = buf.data_ptr()
    stream = torch.cuda.current_stream().cuda_stream
    assert lib.launch_adamw(ptr, ptr, ptr, ptr, 8, 1e-3, 0.9, 0.999, 1e-8, 0.0, 0, stream) != 0  # step 0
    assert lib.launch_adamw(ptr, ptr, ptr, ptr, -1, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, stream) != 0
    assert lib.launch_adamw(ptr, ptr, ptr, ptr, 8, 1e-3, 1.0, 0.999, 1e-8, 0.0, 1, stream) != 0  # beta1 == 1
    p = minitorch.tensor_from_numpy(np.ones((4, 6)), backend=CUDA)
    z = minitorch.tensor_from_numpy(np.zeros((4, 6)), backend=CUDA)
    # The public entry checks shapes, layouts and the step count before any launch ...
    with pytest.raises(minitorch.IndexingError, match="grad of shape"):
        minitorch.adamw_step(p, z.view(6, 4), z, z.zeros(), 1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    with pytest.raises(minitorch.IndexingError, match="needs it contiguous"):
        minitorch.adamw_step(p.permute(1, 0), z.permute(1, 0), z.zeros((6, 4)), z.zeros((6, 4)),
                             1e-3, 0.9, 0.999, 1e-8, 0.0, 1)
    with pytest.raises(ValueError, match="step counts updates from 1"):
        minitorch.adamw_step(p, z, z.zeros(), z.zeros(), 1e-3, 0.9, 0.999, 1e-8, 0.0, 0)
    # ... and the kernel hook turns the launcher's error code into an exception.
    with pytest.raises(CudaKernelError):
        on_tensors(minitorch.CudaKernelOps.adamw_step, p, z, z.zeros(), z.zeros(), 1e-3, 0.9, 0.999, 1e-8, 0.0, 0)
