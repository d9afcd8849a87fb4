"""A script that logs through tensorboard only, with ``wandb.init(sync_tensorboard=True)``:
torch's ``SummaryWriter`` (or tensorboardX's, ``CLIENT_TBX=1``) writes the events and wandb
reads them into the run. One process writes two log directories (``runs/train`` and
``runs/eval``, as given: relative). Under torchrun every rank calls ``wandb.init`` and
writes its own directory, ``runs/rank{rank}``.

Plain wandb code. ``CLIENT_INSTALL=1`` adds the one line a user adds: ``install()``.
"""

from __future__ import annotations

import os

if os.environ.get("CLIENT_INSTALL") == "1":
    import wandb_funnel

    wandb_funnel.install()

import torch.distributed as dist
import wandb

STEPS = 12


def writer(log_dir: str) -> object:
    if os.environ.get("CLIENT_TBX") == "1":
        from tensorboardX import SummaryWriter as TbxWriter

        return TbxWriter(log_dir)
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir)


def main() -> None:
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if ranks > 1:
        dist.init_process_group("gloo")
    wandb.init(project="tb", name=f"tb-rank{rank}", sync_tensorboard=True)
    if ranks > 1:
        # Both ranks' writers open within moments of each other: wandb-core names each
        # directory's keys once it knows two (after 10 s alone it would name them by one).
        dist.barrier()
        writers = {"": writer(os.path.join("runs", f"rank{rank}"))}
    else:
        writers = {name: writer(os.path.join("runs", name)) for name in ("train", "eval")}
    for step in range(STEPS):
        for name, w in writers.items():
            w.add_scalar("loss", (rank + 1) / (step + 1) + len(name), step)  # type: ignore[attr-defined]
            if step % 4 == 0:
                w.add_scalar("accuracy", step / STEPS + rank, step)  # type: ignore[attr-defined]
    for w in writers.values():
        w.close()  # type: ignore[attr-defined]
    if ranks > 1:
        dist.barrier()  # every rank's events are on disk before the run is finished
    wandb.finish()
    if ranks > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
