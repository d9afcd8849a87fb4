"""The every-rank pattern of wandb's own DDP example (``--log_all``): every rank calls
``wandb.init(group=...)`` and logs its own loss. Plain wandb makes a run per rank; through
the funnel it is one run (``run_mode="new"``: a run per rank, grouped).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import wandb


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    wandb.init(project="ddp", group="DDP", config={"world_size": dist.get_world_size()})
    for step in range(10):
        # A training step's collective (DDP's gradient all_reduce): ranks in lockstep, as in
        # real training, so a rank that is slower to start is not a straggler past the
        # funnel's reorder window on a loaded machine (its records would land as late rows).
        dist.all_reduce(torch.ones(1))
        wandb.log({"loss": float(rank + step), "rank": rank})
    wandb.finish()
    dist.destroy_process_group()
    print(f"rank {rank} of pid {os.getpid()} done", flush=True)


if __name__ == "__main__":
    main()
