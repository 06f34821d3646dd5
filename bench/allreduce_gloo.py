#!/usr/bin/env python3
"""allreduce_gloo.py - the reference for bench_allreduce: torch.distributed's
gloo backend, all_reduce(sum) of f32 between local processes, measured the
way bench_allreduce measures ember (barrier, time one call, slowest rank,
median over reps after 2 warm-up calls). Prints "bytes median_ms" per size.

Only the benchmark runs this; the tests never need Python or torch.

usage: allreduce_gloo.py --world N --sizes B1,B2,... --reps R1,R2,...
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, port, sizes, reps, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for size, r in zip(sizes, reps):
        t = torch.zeros(size // 4, dtype=torch.float32)  # as ember's timed calls
        times = []
        for i in range(2 + r):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            out.put((size, 1e3 * statistics.median(slowest.tolist())))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes", default="65536,1048576,16777216,104857600")
    ap.add_argument("--reps", default="1000,200,30,9")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    reps = [int(x) for x in a.reps.split(",")]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(rank_main, args=(a.world, free_port(), sizes, reps, out), nprocs=a.world, start_method="spawn")
    for _ in sizes:
        size, ms = out.get()
        print(size, f"{ms:.4f}", flush=True)


if __name__ == "__main__":
    main()
