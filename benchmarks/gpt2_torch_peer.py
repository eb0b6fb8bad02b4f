"""The PyTorch peer of bench_gpt2.py: a plain eager float32 GPT-2 in PyTorch, trained the llm.c way.

The model is GPT-2 in llm.c's layout (torch's Linear weights are [out, in] like llm.c's, so the
checkpoint loads without transposes; qkv is one Linear of width 3C; the LM head is the first V
rows of wte), attention through torch's scaled_dot_product_attention (causal), GELU tanh, LayerNorm
eps 1e-5. It trains on the shards in order (project.llmc_format.ShardLoader) with torch.optim.AdamW
(0.9, 0.999, eps 1e-8) at a constant learning rate, reading the loss every step, and writes per-step
losses and milliseconds plus torch's allocator peak to a JSON file. This is a reference to measure
against (torch computes here, never inside minitorch).

    python benchmarks/gpt2_torch_peer.py --init-from gpt2_124M.bin --train-shards 'train_*.bin' --tf32 false --out r.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from common import write_json
from project.gpt2.llmc import GPT2Config, read_checkpoint
from project.gpt2.shards import ShardLoader
from project.common.options import str2bool


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

    def load_llmc(self, params: dict) -> None:
        """Copy llm.c-layout arrays into the parameters (no transposes needed)."""
        t = lambda a: torch.from_numpy(a.copy())  # noqa: E731
        with torch.no_grad():
            self.wte.weight.copy_(t(params["wte"]))
            self.wpe.weight.copy_(t(params["wpe"]))
            for l, b in enumerate(self.blocks):
                for module, w, bias in ((b.ln_1, "ln1w", "ln1b"), (b.c_attn, "qkvw", "qkvb"),
                                        (b.attn_proj, "attprojw", "attprojb"), (b.ln_2, "ln2w", "ln2b"),
                                        (b.c_fc, "fcw", "fcb"), (b.fc_proj, "fcprojw", "fcprojb")):
                    module.weight.copy_(t(params[w][l]))
                    module.bias.copy_(t(params[bias][l]))
            self.ln_f.weight.copy_(t(params["lnfw"]))
            self.ln_f.bias.copy_(t(params["lnfb"]))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight[: self.V].T
        return F.cross_entropy(logits.view(-1, self.V), targets.view(-1))


def main(argv: Any = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--init-from", required=True, help="llm.c float32 checkpoint")
    p.add_argument("--train-shards", required=True, help="llm.c token shards (glob)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--tf32", type=str2bool, default=False, metavar="true|false", help="TF32 tensor-core matmuls")
    p.add_argument("--out", required=True, help="JSON file for losses, ms per step and allocator peak")
    args = p.parse_args(argv)

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    config, params = read_checkpoint(args.init_from)
    model = TorchGPT2(config)
    model.load_llmc(params)
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    loader = ShardLoader(args.train_shards, args.batch_size, args.seq_len)
    torch.cuda.reset_peak_memory_stats()
    losses, ms = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        inputs, targets = (torch.from_numpy(a).cuda() for a in loader.next_batch())
        loss = model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        ms.append((time.perf_counter() - start) * 1e3)
        print(f"step {step + 1:4d}/{args.steps}: train loss {losses[-1]:.6f} ({ms[-1]:.1f} ms)", flush=True)
    result = {"losses": losses, "ms": ms, "allocator_peak_mib": torch.cuda.max_memory_allocated() / 2**20}
    write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
