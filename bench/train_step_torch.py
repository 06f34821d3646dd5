#!/usr/bin/env python3
"""train_step_torch.py - the PyTorch reference for bench_train: times one
full training step (forward, backward, gradient clipping to norm 1.0, AdamW
step) of a GPT-2 style model with the same shapes ember's bench uses, and
prints one JSON line.

Three ways to run PyTorch's step (--mode):
  eager    the model as written, AdamW with PyTorch's default implementation
  fused    the same with AdamW(fused=True) (PyTorch 2.4 and later on the CPU)
  compile  torch.compile(model) (Inductor; needs a C++ compiler at run time),
           with fused AdamW where this PyTorch has it on the CPU
A mode this PyTorch cannot run prints {"error": "..."} and exits 1.
--info prints the version and build of this PyTorch and which modes it has.

Only the benchmark runs this; the tests never need Python or torch.

usage: train_step_torch.py --config tiny|124m --threads N [--mode M] [--steps S] [--warmup W]
       train_step_torch.py --info
"""
import argparse
import json
import math
import resource
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as exc:  # --info says so; bench_train then runs without a reference
    torch = None
    IMPORT_ERROR = str(exc)
IMPORT_RSS_MB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # what `import torch` alone takes

CONFIGS = {
    # layers, heads, width, vocab, context, batch
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, vocab=65, block=64, batch=12),
    "124m": dict(n_layer=12, n_head=12, n_embd=768, vocab=50257, block=64, batch=4),
}


def error_text(exc):
    """The first line of an exception, short and safe inside a JSON string for bench_train."""
    lines = str(exc).strip().splitlines()
    text = type(exc).__name__ + (": " + lines[0] if lines else "")
    return text.replace("\\", "/").replace('"', "'")[:240]


def fused_adamw_support():
    """"yes", or why this PyTorch has no fused AdamW for CPU tensors."""
    try:
        p = torch.zeros(4, requires_grad=True)
        p.grad = torch.ones(4)
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
        opt.step()
        return "yes"
    except (TypeError, RuntimeError, ValueError) as exc:
        return "no: " + error_text(exc)


def info():
    """One JSON line: where this PyTorch is, its version and build, and its modes."""
    if torch is None:
        return {"error": "cannot import torch: " + IMPORT_ERROR.replace('"', "'"), "python": sys.executable}
    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "unknown"
    return {
        "torch": torch.__version__,
        "python": sys.executable,
        "build": "MKL %s, oneDNN %s, CPU capability %s" % (
            "yes" if torch.backends.mkl.is_available() else "no",
            "yes" if torch.backends.mkldnn.is_available() else "no", cap),
        "fused": fused_adamw_support(),
        "compile": "yes" if hasattr(torch, "compile") else "no: torch.compile is not in PyTorch " + torch.__version__,
    }


class Block(nn.Module if torch else object):
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


class GPT(nn.Module if torch else object):
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


def run(a):
    """Times the steps; returns the JSON line's fields."""
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = CONFIGS[a.config]
    model = GPT(cfg)
    fused = a.mode == "fused" or (a.mode == "compile" and fused_adamw_support() == "yes")
    opt_args = dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)
    opt = torch.optim.AdamW(model.parameters(), **opt_args, **({"fused": True} if fused else {}))
    step_model = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator().manual_seed(1)
    times = []
    for i in range(a.warmup + a.steps):
        idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["block"]), generator=gen)
        tgt = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["block"]), generator=gen)
        t0 = time.perf_counter()
        loss = step_model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as ember's step
        opt.step()
        t1 = time.perf_counter()
        times.append(t1 - t0)
    first = times[0]
    times = sorted(times[a.warmup:])
    med = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
    return {
        "impl": "pytorch " + torch.__version__,
        "mode": a.mode,
        "adamw": "fused" if fused else "default",
        "config": a.config,
        "threads": a.threads,
        "ms_per_step": 1e3 * med,
        "first_step_s": first,
        "tokens_per_s": cfg["batch"] * cfg["block"] / med,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "import_rss_mb": IMPORT_RSS_MB,
        "loss": loss.item(),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--info", action="store_true")
    ap.add_argument("--config", choices=CONFIGS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mode", choices=("eager", "fused", "compile"), default="eager")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if a.info:
        out = info()
    elif not a.config:
        ap.error("--config is required (or --info)")
    elif torch is None:
        out = {"error": "cannot import torch: " + IMPORT_ERROR.replace('"', "'")}
    elif a.mode == "fused" and not fused_adamw_support().startswith("yes"):
        out = {"error": "fused AdamW: " + fused_adamw_support()}
    elif a.mode == "compile" and not hasattr(torch, "compile"):
        out = {"error": "torch.compile is not in PyTorch " + torch.__version__}
    else:
        try:
            out = run(a)
        except Exception as exc:  # e.g. Inductor finds no C++ compiler: say why, bench_train goes on
            out = {"error": error_text(exc)}
    print(json.dumps(out), flush=True)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
