"""An unmodified wandb DDP script (issue 38): run under ``wandb-funnel run`` on each of two
torchrun agents (two nodes), every rank calls ``wandb.init`` and logs ``loss`` and a key of
its own at 10 steps; tests/processes/test_nodes.py reads the one run back."""

from __future__ import annotations

import time

import torch.distributed as dist
import wandb

dist.init_process_group("gloo")
rank = dist.get_rank()
wandb.init(project="nodes", config={"lr": 0.1})
for step in range(10):
    wandb.log({"loss": float(rank + step), f"r{rank}": step}, step=step)
    time.sleep(0.02)
dist.barrier()
wandb.finish()
dist.destroy_process_group()
