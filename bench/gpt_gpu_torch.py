"""gpt_gpu_torch.py — the reference for bench_gpu: GPT-2 124M training in
PyTorch on one CUDA device, bf16 autocast with f32 weights, fused AdamW,
clip 1.0, T = 1024, in eager mode and under torch.compile. Prints the same
line format as bench_gpu (tokens/s, MFU with the same FLOP count, peak
memory). The model is written here, not imported, so both sides are the
same architecture (GPT-2: learned positions, pre-norm blocks, GELU(tanh),
tied embedding and head).

usage: python3 gpt_gpu_torch.py [eager|compile] [batch ...]"""
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, T, L, H, C = 50304, 1024, 12, 12, 768


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, C))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V).float(), targets.view(-1))


def run(mode, batch, steps, peak):
    torch.manual_seed(1)
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(steps + 3):
        x = torch.randint(0, V, (batch, T), device="cuda")
        y = torch.randint(0, V, (batch, T), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times[3:])
    n = sum(p.numel() for p in model.parameters()) - T * C
    flops_tok = 6 * n + 12 * L * C * T
    tok_s = batch * T / sec
    print(f"torch-{mode:<7} B={batch:<3} {sec * 1e3:8.1f} ms/step {tok_s:10.0f} tokens/s  "
          f"MFU {100 * tok_s * flops_tok / peak:5.1f}%  peak {torch.cuda.max_memory_allocated() / 2**30:6.2f} GiB",
          flush=True)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "eager"
    batches = [int(b) for b in sys.argv[2:]] or [8, 16, 32]
    peak = float(os.environ.get("EMBER_PEAK_TFLOPS", "989")) * 1e12
    steps = int(os.environ.get("EMBER_BENCH_STEPS", "20"))
    for b in batches:
        try:
            run(mode, b, steps, peak)
        except torch.cuda.OutOfMemoryError:
            print(f"torch-{mode:<7} B={b:<3} out of memory", flush=True)
            torch.cuda.empty_cache()
