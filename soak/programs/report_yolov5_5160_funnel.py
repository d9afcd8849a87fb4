"""ultralytics/yolov5#5160 through wandb-funnel: DDP training ending in ``destroy_process_group()``.

https://github.com/ultralytics/yolov5/issues/5160 ("Docker Multi-GPU DDP training hang on
``destroy_process_group()`` with wandb option 3")

The same yolov5 stand-in as ``report_yolov5_5160_plain.py``, logging through ``wf.init``,
with one change the funnel invites: yolov5 creates its W&B logger on ``RANK in (-1, 0)``
only; here every rank creates it (``wf.init`` under torchrun attaches every rank to one run,
hosted by rank 0) and logs its own epoch losses, which the funnel reduces to the mean.
As in yolov5, only rank 0 calls ``finish()`` (in ``on_train_end``), and then rank 0 alone
calls ``dist.destroy_process_group()``; rank 1 returns without finishing, so its records
must reach the run through its exit hook while rank 0's finish waits for it (bounded).

The job must exit soon after training (torchrun exit code 0), with every ``r0``/``r1``
record in the run and exit code 0, and nothing left behind.

Run under torchrun (gloo on CPU), as the harness does:
``python -m torch.distributed.run --standalone --nproc-per-node 2 report_yolov5_5160_funnel.py``.
Slot = rank; every rank logs (``r0``, ``r1``).
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wandb_funnel as wf
from wandb_funnel.soak import probe

LOCAL_RANK = int(os.getenv("LOCAL_RANK", "-1"))
RANK = int(os.getenv("RANK", "-1"))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", "1"))
LOGGER = logging.getLogger("yolov5")
logging.basicConfig(format="%(message)s", level=logging.INFO)


class WandbLogger:
    """utils/loggers/wandb/wandb_utils.WandbLogger on a ``wf.Run``: one record per epoch."""

    def __init__(self, project: str, name: str) -> None:
        self.wandb_run = wf.init(project=project, name=name, job_type="Training")
        self.slot = max(RANK, 0)
        self.log_dict: dict[str, Any] = {}
        self.records = 0

    def log(self, log_dict: dict[str, Any]) -> None:
        self.log_dict.update(log_dict)

    def end_epoch(self) -> None:
        self.log_dict[f"r{self.slot}"] = self.records  # for the soak harness (r<slot> cells)
        self.wandb_run.log(self.log_dict, step=self.records)
        probe.count(self.slot)
        self.records += 1
        self.log_dict = {}

    def finish_run(self) -> None:
        if self.log_dict:
            self.end_epoch()
        self.wandb_run.finish()


def train(epochs: int, batches: int) -> None:
    wandb_logger = WandbLogger("YOLOv5", "exp")  # every rank (yolov5: RANK in (-1, 0))
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)
    )
    if RANK != -1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937)
    for epoch in range(epochs):
        mloss = torch.zeros(3)
        for i in range(batches):
            imgs = torch.randn(8, 3, 16, 16)
            targets = torch.randint(0, 5, (8,))
            loss = nn.functional.cross_entropy(model(imgs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mloss = (mloss * i + loss.detach()) / (i + 1)
        box, obj, cls = (float(v) for v in mloss)
        wandb_logger.log({"train/box_loss": box, "train/obj_loss": obj, "train/cls_loss": cls})
        if RANK in (-1, 0):  # on_fit_epoch_end: validation metrics on rank 0
            wandb_logger.log({"metrics/mAP_0.5": 1.0 / (1.0 + box), "x/lr0": 0.01, "epoch": epoch})
        wandb_logger.end_epoch()
        if RANK in (-1, 0) and epoch == 2:
            probe.event("ready")
    if RANK in (-1, 0):  # on_train_end
        wandb_logger.log({"metrics/mAP_0.5:0.95": 0.5, "best/epoch": epochs - 1})
        wandb_logger.finish_run()
    if RANK in (-1, 0):
        probe.event("train_end")


def main() -> None:
    if LOCAL_RANK != -1:
        dist.init_process_group(backend="gloo")  # yolov5: "nccl" when available; CPU here
    probe.event("worker", slot=max(RANK, 0), rank=RANK)
    rng = probe.rng()  # seeded by the harness: the same in every rank
    train(epochs=rng.randint(20, 40), batches=rng.randint(8, 12))
    if WORLD_SIZE > 1 and RANK == 0:
        LOGGER.info("Destroying process group... ")
        dist.destroy_process_group()
        LOGGER.info("Done.")


if __name__ == "__main__":
    main()
