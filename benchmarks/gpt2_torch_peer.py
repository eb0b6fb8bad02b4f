"""The PyTorch peer of bench_gpt2.py and gpt2_bf16_parity.py: GPT-2 in PyTorch, trained the llm.c way.

The model is GPT-2 in llm.c's layout (torch's Linear weights are [out, in] like llm.c's, so the
checkpoint loads without transposes; qkv is one Linear of width 3C; the LM head is the first V
rows of wte), attention through torch's scaled_dot_product_attention (causal), GELU tanh, LayerNorm
eps 1e-5. It trains on the shards in order (project.gpt2.shards.ShardLoader) with torch.optim.AdamW
(0.9, 0.999, eps 1e-8) at the programs' learning-rate schedule (warm-up, cosine), and writes per-step
losses and milliseconds plus torch's allocator peak to a JSON file. As train_gpt2.py does, it queues
step i before it reads step i - 1's loss (copied to pinned memory behind that step), so that its host
work overlaps the GPU's; a step's time runs from the previous step's loss to its own.
Float32 by default (TF32 with --tf32 true); --dtype bf16 runs the forward pass under
torch.autocast(bfloat16) with float32 master weights (SDPA then takes its flash kernel), --compile
adds torch.compile, --fused-adamw torch's fused AdamW. This is a reference to measure against (torch
computes here, never inside minitorch).

    python benchmarks/gpt2_torch_peer.py --init-from gpt2_124M.bin --train-shards 'train_*.bin' --tf32 false --out r.json
    python benchmarks/gpt2_torch_peer.py --init-from gpt2_124M.bin --train-shards 'train_*.bin' --dtype bf16 \\
        --compile true --fused-adamw true --out r.json
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from common import write_json
from project.common.options import str2bool
from project.common.schedule import learning_rate
from project.gpt2.llmc import GPT2Config, read_checkpoint
from project.gpt2.shards import ShardLoader

# A block's (module, llm.c weight name, llm.c bias name), in llm.c's order.
LAYER_PARAMETERS = (
    ("ln_1", "ln1w", "ln1b"), ("c_attn", "qkvw", "qkvb"), ("attn_proj", "attprojw", "attprojb"),
    ("ln_2", "ln2w", "ln2b"), ("c_fc", "fcw", "fcb"), ("fc_proj", "fcprojw", "fcprojb"),
)  # fmt: skip
WHOLE_MODEL = ("wte", "wpe", "lnfw", "lnfb")  # the llm.c tensors that are not per layer


class Block(nn.Module):
    def __init__(self, C: int, NH: int) -> None:
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT2(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.V = config.vocab_size
        self.wte = nn.Embedding(config.padded_vocab_size, config.channels)
        self.wpe = nn.Embedding(config.max_seq_len, config.channels)
        self.blocks = nn.ModuleList(Block(config.channels, config.num_heads) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.channels, eps=1e-5)

    def llmc_tensors(self) -> dict:
        """llm.c name -> the parameters holding it (one per layer for the per-layer names, else one)."""
        out: dict = {"wte": [self.wte.weight], "wpe": [self.wpe.weight]}
        for attribute, weight, bias in LAYER_PARAMETERS:
            out[weight] = [getattr(b, attribute).weight for b in self.blocks]
            out[bias] = [getattr(b, attribute).bias for b in self.blocks]
        return {**out, "lnfw": [self.ln_f.weight], "lnfb": [self.ln_f.bias]}

    def load_llmc(self, params: dict) -> None:
        """Copy llm.c-layout arrays into the parameters (no transposes needed)."""
        with torch.no_grad():
            for name, tensors in self.llmc_tensors().items():
                values = [params[name]] if name in WHOLE_MODEL else params[name]
                for tensor, value in zip(tensors, values):
                    tensor.copy_(torch.from_numpy(np.array(value, dtype=np.float32)))

    def llmc_grads(self) -> dict:
        """The parameters' gradients as float64 arrays in llm.c's layout (the inverse of load_llmc)."""
        grads = {}
        for name, tensors in self.llmc_tensors().items():
            values = [t.grad.detach().double().cpu().numpy() for t in tensors]
            grads[name] = values[0] if name in WHOLE_MODEL else np.stack(values)
        return grads

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight[: self.V].T
        return F.cross_entropy(logits.view(-1, self.V), targets.view(-1))


def main(argv: Any = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init-from", required=True, help="llm.c checkpoint (float32 or bfloat16)")
    p.add_argument("--train-shards", required=True, help="llm.c token shards (glob)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up, then cosine decay (train_gpt2.py's)")
    p.add_argument("--final-lr-frac", type=float, default=1.0, help="the cosine decays to lr * this at the last step")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=0.0, help="global gradient-norm clip (0: off)")
    p.add_argument("--tf32", type=str2bool, default=False, metavar="true|false", help="TF32 tensor-core matmuls")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: forward under torch.autocast(bfloat16), float32 master weights and AdamW")
    p.add_argument("--compile", type=str2bool, default=False, metavar="true|false", help="torch.compile the model")
    p.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"), default="default",
                   help="torch.compile's mode: reduce-overhead replays the compiled forward and backward as CUDA graphs")
    p.add_argument("--fused-adamw", type=str2bool, default=False, metavar="true|false", help="torch's fused AdamW")
    p.add_argument("--out", required=True, help="JSON file for losses, ms per step and allocator peak")
    args = p.parse_args(argv)

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    config, params = read_checkpoint(args.init_from)
    model = TorchGPT2(config)
    model.load_llmc(params)
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=args.weight_decay, fused=args.fused_adamw)  # fmt: skip
    mode = None if args.compile_mode == "default" else args.compile_mode
    step_model = torch.compile(model, mode=mode) if args.compile else model
    loader = ShardLoader(args.train_shards, args.batch_size, args.seq_len)
    precision = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if args.dtype == "bf16" else contextlib.nullcontext
    torch.cuda.reset_peak_memory_stats()
    losses, ms = [], []
    # Two pinned slots for the losses, used in turn: step i's slot was last read by step i - 2's
    # finish(), which ran during step i - 1.
    hosts = [torch.empty(1, pin_memory=True) for _ in range(2)]
    events = [torch.cuda.Event() for _ in range(2)]
    pending = None  # (pinned host copy of the previous step's loss, the event after that copy)
    finished = time.perf_counter()

    def finish() -> None:
        nonlocal finished
        host, event = pending
        event.synchronize()
        now = time.perf_counter()
        losses.append(float(host[0]))
        ms.append((now - finished) * 1e3)
        finished = now
        print(f"step {len(losses):4d}/{args.steps}: train loss {losses[-1]:.6f} ({ms[-1]:.1f} ms)", flush=True)

    for step in range(args.steps):
        inputs, targets = (torch.from_numpy(a).cuda(non_blocking=True) for a in loader.next_batch())
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.lr, args.warmup_steps, args.steps, args.final_lr_frac)
        with precision():
            loss = step_model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        host, event = hosts[step % 2], events[step % 2]
        host.copy_(loss.detach().float().reshape(1), non_blocking=True)
        event.record()
        if pending is not None:
            finish()
        pending = (host, event)
    if pending is not None:
        finish()
    result = {"losses": losses, "ms": ms, "allocator_peak_mib": torch.cuda.max_memory_allocated() / 2**20}
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
