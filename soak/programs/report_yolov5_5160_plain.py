"""ultralytics/yolov5#5160, plain wandb: DDP training ending in ``destroy_process_group()``.

https://github.com/ultralytics/yolov5/issues/5160 ("Docker Multi-GPU DDP training hang on
``destroy_process_group()`` with wandb option 3")

What the user did: ``python -m torch.distributed.launch --nproc_per_node 2 train.py ...``.
yolov5's ``train.py`` reads ``LOCAL_RANK``/``RANK``/``WORLD_SIZE`` from the environment, calls
``init_process_group``, and creates its ``Loggers`` (and so ``wandb.init``) on ``RANK in
(-1, 0)`` only. Rank 0 logs the epoch's metrics at the end of every epoch; at the end of
training ``on_train_end`` logs the final results and calls ``wandb.run.finish()``. Then
``main()`` does ``if WORLD_SIZE > 1 and RANK == 0: dist.destroy_process_group()``; the other
ranks just return.

What went wrong with plain wandb (0.12, in Docker, wandb "option 3"): the job hung in rank 0's
``destroy_process_group()`` after training, and never exited.

Run under torchrun (gloo on CPU), as the harness does:
``python -m torch.distributed.run --standalone --nproc-per-node 2 report_yolov5_5160_plain.py``.
Slot = rank; only rank 0 logs (``r0``).
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist
import wandb
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from wandb_funnel.soak import probe

LOCAL_RANK = int(os.getenv("LOCAL_RANK", "-1"))
RANK = int(os.getenv("RANK", "-1"))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", "1"))
LOGGER = logging.getLogger("yolov5")
logging.basicConfig(format="%(message)s", level=logging.INFO)


class WandbLogger:
    """utils/loggers/wandb/wandb_utils.WandbLogger: one record per epoch, finish at the end."""

    def __init__(self, project: str, name: str) -> None:
        self.wandb_run = wandb.init(project=project, name=name, job_type="Training")
        self.log_dict: dict[str, Any] = {}
        self.records = 0

    def log(self, log_dict: dict[str, Any]) -> None:
        self.log_dict.update(log_dict)

    def end_epoch(self) -> None:
        self.log_dict["r0"] = self.records  # for the soak harness, which counts r<slot> cells
        wandb.log(self.log_dict)
        probe.count(0)
        self.records += 1
        self.log_dict = {}

    def finish_run(self) -> None:
        if self.log_dict:
            self.end_epoch()
        wandb.run.finish()  # type: ignore[union-attr]


def train(epochs: int, batches: int) -> None:
    wandb_logger = WandbLogger("YOLOv5", "exp") if RANK in (-1, 0) else None
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
        if wandb_logger is not None:  # RANK in (-1, 0): on_fit_epoch_end
            box, obj, cls = (float(v) for v in mloss)
            wandb_logger.log(
                {
                    "train/box_loss": box,
                    "train/obj_loss": obj,
                    "train/cls_loss": cls,
                    "metrics/mAP_0.5": 1.0 / (1.0 + box),
                    "x/lr0": 0.01,
                    "epoch": epoch,
                }
            )
            wandb_logger.end_epoch()
            if epoch == 2:
                probe.event("ready")
    if wandb_logger is not None:  # on_train_end
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
