"""A rank-0-only script that logs its own ``global_step`` (as many public scripts, and wandb's
tensorboard sync, do), under torchrun or alone. Plain wandb code; ``CLIENT_INSTALL=1`` adds
``install()``. Each row also carries ``t_logged``, the wall time of its ``wandb.log`` call, so
that a reader can see how long the row took to be written (``_timestamp - t_logged``)."""

from __future__ import annotations

import os
import sys
import time

if os.environ.get("CLIENT_INSTALL") == "1":
    import wandb_funnel

    wandb_funnel.install()

import torch.distributed as dist
import wandb


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    ddp = "RANK" in os.environ
    if ddp:
        dist.init_process_group("gloo")
    if not ddp or dist.get_rank() == 0:
        run = wandb.init(project="user-step", name="user-step-run")
        for i in range(steps):
            run.log({"global_step": 1000 * (i + 1), "loss": 1.0 / (i + 1), "t_logged": time.time()})
            time.sleep(0.05)
        run.finish()
    if ddp:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
