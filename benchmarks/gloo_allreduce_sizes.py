"""Latency of one Gloo all-reduce by element count (run under torchrun, CPU).

    OMP_NUM_THREADS=1 torchrun --standalone --nnodes=1 --nproc-per-node=2 \\
        benchmarks/gloo_allreduce_sizes.py

Prints, on rank 0, the best of three rounds of 1000 back-to-back all-reduces
of a float64 tensor for each size. On the 2-core machine of
docs/performance.md, two elements take about 0.28 ms and three or more about
0.6-0.9 ms, which is why the size of the per-update agreement matters.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

SIZES = (1, 2, 3, 4, 8, 226)  # 226: the sl_ddp MLP's gradient bucket
ROUNDS = 3
CALLS = 1000


def main() -> None:
    dist.init_process_group("gloo")
    best: dict[int, float] = {}
    for _ in range(ROUNDS):
        for size in SIZES:
            buf = torch.zeros(size, dtype=torch.float64)
            for _ in range(50):
                dist.all_reduce(buf)
            dist.barrier()
            started = time.perf_counter()
            for _ in range(CALLS):
                dist.all_reduce(buf)
            per_call = (time.perf_counter() - started) / CALLS
            best[size] = min(best.get(size, per_call), per_call)
    if dist.get_rank() == 0:
        for size, seconds in best.items():
            print(f"{size:4d} x float64: {seconds * 1e3:.3f} ms per all_reduce")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
