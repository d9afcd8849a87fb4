"""The training under test: plain wandb code, in several processes (nothing of wandb_funnel).

    wandb-funnel run -- python examples/capture_run/my_training.py

The main process opens the run and logs the learning rate; a spawn pool of workers each
trains a shard and logs its ``loss`` and ``samples`` at every step. Through the funnel it is
one run: ``loss`` averaged across the workers at each step, ``samples`` summed (``reduce=``).
``test_my_training.py`` beside it checks, with ``capture_run``, that it logs what it should.
"""

from __future__ import annotations

import math
import multiprocessing as mp

import wandb


def worker(args: tuple[int, int]) -> None:
    shard, steps = args
    wandb.init()  # a worker joins the job's run (plain wandb: a run of its own)
    for step in range(steps):
        loss = math.exp(-step / 5) + shard / 100
        wandb.log({"loss": loss, "samples": 32}, step=step)
    wandb.finish()


def train(steps: int = 10, workers: int = 2) -> None:
    wandb.init(project="my-training", config={"steps": steps, "workers": workers, "lr": 0.1})
    wandb.log({"lr": 0.1}, step=0)
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(worker, [(shard, steps) for shard in range(workers)])
    wandb.summary["shards"] = workers
    wandb.finish()


if __name__ == "__main__":
    train()
