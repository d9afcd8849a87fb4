"""A DDP job under torchrun (gloo on CPU): every rank logs through ``wf.init``.

    torchrun --standalone --nproc-per-node N ddp.py [--raise-rank R] [--loader-workers W]

- ``--raise-rank R``: rank R raises mid-training (torchrun then stops the others).
- ``--loader-workers W``: after logging a while, each rank iterates a ``DataLoader`` with W
  forked workers whose ``__getitem__`` logs too (DataLoader-style children of a rank that
  has already logged).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import wandb_funnel as wf
from wandb_funnel.soak import probe


class Logged(Dataset[int]):
    """Each item fetched in a loader worker logs one record (step = the item's index)."""

    def __init__(self, rank: int, size: int, start: int) -> None:
        self.rank, self.size, self.start = rank, size, start

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        info = torch.utils.data.get_worker_info()
        slot = 64 + self.rank * 8 + (info.id if info else 0)
        wf.log({f"r{slot}": index}, step=self.start + index)
        probe.count(slot)
        return index


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0)  # 0: 100 to 300, at random
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rng = probe.rng()
    steps = args.steps or rng.randint(100, 300)
    raise_at = rng.randint(1, steps - 1)
    probe.event("worker", slot=rank, rank=rank)
    # A wide window: ranks on a loaded 2-core machine are descheduled for seconds.
    run = wf.init(project="soak", close_timeout=8, reorder_window=30)
    rng.seed(f"{os.environ.get(probe.SEED_ENV)}-{rank}")
    for step in range(steps):
        loss = torch.tensor(1.0 / (step + 1))
        probe.attempt(rank)
        run.log({f"r{rank}": step, "loss": loss}, step=step)
        probe.count(rank)
        if step == 10 and rank == 0:
            probe.event("ready")
        if rank == args.raise_rank and step == raise_at:
            probe.event("train_end")
            raise RuntimeError(f"rank {rank} failed at step {step}")
        time.sleep(rng.uniform(0, 0.01))
    if args.loader_workers:
        loader = DataLoader(
            Logged(rank, 40, steps),
            num_workers=args.loader_workers,
            multiprocessing_context="fork",
        )
        for _ in loader:
            pass
    probe.event("train_end", rank=rank)
    if rank == 0:
        probe.event("run_closing")  # a SIGTERM from here on finds the run closing with 0
    run.finish()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
