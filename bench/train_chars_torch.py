#!/usr/bin/env python3
"""train_chars_torch.py - the PyTorch reference for `ember train`: the same
character-level GPT, data split, sampler and optimisation (nanoGPT's CPU
settings for tiny Shakespeare), so a validation loss can be compared side by
side on one machine. Prints `eval step=N train_loss=X val_loss=Y` lines
like ember. Used by people checking ember, never by the tests.

usage: train_chars_torch.py FILE.txt [--iters 2000] [--seed 1337] [--threads 1]
"""
import argparse
import math

import torch

from train_step_torch import GPT


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-iters", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    text = open(a.data, "rb").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    cut = int(0.9 * len(data))
    splits = {"train": data[:cut], "val": data[cut:]}
    block, batch, lr, min_lr, warmup = 64, 12, 1e-3, 1e-4, 100

    def get_batch(split):
        d = splits[split]
        ix = torch.randint(len(d) - block, (batch,))
        return (torch.stack([d[i:i + block] for i in ix]), torch.stack([d[i + 1:i + 1 + block] for i in ix]))

    cfg = dict(n_layer=4, n_head=4, n_embd=128, vocab=len(vocab), block=block, batch=batch)
    model = GPT(cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.99))

    def lr_at(step):  # linear warm-up, then cosine to min_lr at the last step
        if step < warmup:
            return lr * (step + 1) / warmup
        r = (step - warmup) / max(1, a.iters - warmup)
        return min_lr + 0.5 * (1 + math.cos(math.pi * min(r, 1.0))) * (lr - min_lr)

    @torch.no_grad()
    def evaluate():
        model.eval()
        out = {}
        for split in ("train", "val"):
            out[split] = sum(model(*get_batch(split)).item() for _ in range(a.eval_iters)) / a.eval_iters
        model.train()
        return out

    for step in range(a.iters + 1):
        if step % a.eval_every == 0 or step == a.iters:
            e = evaluate()
            print(f"eval step={step} train_loss={e['train']:.4f} val_loss={e['val']:.4f}", flush=True)
        if step == a.iters:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(*get_batch("train"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


if __name__ == "__main__":
    main()
