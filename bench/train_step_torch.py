#!/usr/bin/env python3
"""train_step_torch.py - the PyTorch reference for bench_train: times one
full training step (forward, backward, AdamW step) of a GPT-2 style model
with the same shapes ember's bench uses, and prints one JSON line.

Only the benchmark runs this; the tests never need Python or torch.

usage: train_step_torch.py --config tiny|124m --threads N [--steps S] [--warmup W]
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    # layers, heads, width, vocab, context, batch
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, vocab=65, block=64, batch=12),
    "124m": dict(n_layer=12, n_head=12, n_embd=768, vocab=50257, block=64, batch=4),
}


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), x + mlp(ln(x))."""

    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj2 = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(
            F, "scaled_dot_product_attention") else self.attend(q, k, v)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.c_proj2(F.gelu(self.c_fc(self.ln_2(x))))  # exact GELU, as nanoGPT

    @staticmethod
    def attend(q, k, v):
        t = q.shape[-2]
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.wte = nn.Embedding(cfg["vocab"], c)
        self.wpe = nn.Embedding(cfg["block"], c)
        self.h = nn.ModuleList(Block(c, cfg["n_head"]) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(c)
        for mod in self.modules():  # GPT-2 init, as ember's GPT
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, 0.0, 0.02)
            if isinstance(mod, nn.Linear):
                nn.init.zeros_(mod.bias)
        for blk in self.h:  # residual projections scaled by 1/sqrt(2 * n_layer)
            for proj in (blk.c_proj, blk.c_proj2):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * cfg["n_layer"]))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output projection
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=CONFIGS, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = CONFIGS[a.config]
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    times = []
    for i in range(a.warmup + a.steps):
        idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["block"]), generator=gen)
        tgt = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["block"]), generator=gen)
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        if i >= a.warmup:
            times.append(t1 - t0)
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({
        "impl": "pytorch " + torch.__version__,
        "config": a.config,
        "threads": a.threads,
        "ms_per_step": 1e3 * med,
        "tokens_per_s": cfg["batch"] * cfg["block"] / med,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "loss": float(loss),
    }))


if __name__ == "__main__":
    main()
