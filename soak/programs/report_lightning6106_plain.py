"""Lightning-AI/pytorch-lightning#6106, plain wandb: ``ddp_spawn`` with a W&B logger.

https://github.com/Lightning-AI/pytorch-lightning/issues/6106 ("pl+wandb: Hanging during
'cleaning up ddp environment' when using DDPSpawnPlugin + WandbLogger")

What the user did: ``Trainer(accelerator="ddp_spawn", num_processes=2,
logger=WandbLogger(...))`` and ``trainer.fit(model)``. Lightning is not installed here, so
this script does what Lightning's ``WandbLogger`` and ddp_spawn strategy do:
- the logger's run is created in the main process (``WandbLogger.__getstate__`` creates the
  experiment before pickling, so that the workers attach to it through wandb-core);
- ``torch.multiprocessing.spawn`` starts one process per rank, each receiving the pickled
  trainer (and so the logger); each rank joins a gloo process group and trains a DDP model;
- ``log_metrics`` / ``log_hyperparams`` are ``rank_zero_only``: rank 0 logs every step
  through the unpickled run (it re-attaches to the main process's run on first use);
- after ``spawn`` returns, the main process calls ``logger.finalize("success")`` (which, in
  Lightning, does not finish the run) and exits: wandb's atexit finishes it.

What went wrong with plain wandb (2021): the job hung at the end, in "cleaning up ddp
environment", whenever a worker had been spawned and the logger had been used.

Run: ``python report_lightning6106_plain.py`` (it spawns its 2 ranks itself; gloo on CPU).
Slot = rank; only rank 0 logs (``r0``).
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import os
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import wandb
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from wandb_funnel.soak import probe

NUM_PROCESSES = 2


class WandbLogger:
    """What ``pytorch_lightning.loggers.WandbLogger`` does with ddp_spawn."""

    def __init__(self, project: str, **kwargs: Any) -> None:
        self._wandb_init = {"project": project, **kwargs}
        self._experiment: Any = None
        self._attach_id: str | None = None
        self.rank = 0  # set by the strategy in each spawned process (rank_zero_only)

    def __getstate__(self) -> dict[str, Any]:
        # Lightning's hack: create the run in the main process before the logger is pickled
        # into the spawned workers, which then attach to it through wandb-core.
        _ = self.experiment
        state = self.__dict__.copy()
        state["_attach_id"] = getattr(self._experiment, "_attach_id", None)
        state["_experiment"] = None
        return state

    @property
    def experiment(self) -> Any:
        if self._experiment is None:
            if wandb.run is not None:
                self._experiment = wandb.run
            elif self._attach_id is not None:
                self._experiment = wandb._attach(self._attach_id)  # type: ignore[attr-defined]
            else:
                self._experiment = wandb.init(**self._wandb_init)
                self._experiment.define_metric("trainer/global_step")
                self._experiment.define_metric("*", step_metric="trainer/global_step")
        return self._experiment

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        if self.rank == 0:
            self.experiment.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.rank == 0:
            self.experiment.log({**metrics, "trainer/global_step": step})

    def finalize(self, status: str) -> None:
        pass  # Lightning's WandbLogger.finalize uploads checkpoints; it does not finish the run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def new_process(rank: int, logger: WandbLogger, epochs: int, hparams: dict[str, Any]) -> None:
    """DDPSpawnStrategy.new_process: set up the rank, fit, clean up the ddp environment."""
    probe.event("worker", slot=rank, rank=rank)
    logger.rank = rank
    dist.init_process_group("gloo", rank=rank, world_size=NUM_PROCESSES)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, NUM_PROCESSES, rank, shuffle=True, seed=0
    )
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DistributedDataParallel(nn.Linear(8, 1))  # the report's "ConstantMultiply"
    optimizer = torch.optim.SGD(model.parameters(), lr=hparams["lr"])
    logger.log_hyperparams(hparams)
    global_step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0:
                logger.log_metrics(
                    {"train_loss": loss.item(), "epoch": epoch, "r0": global_step}, step=global_step
                )
                probe.count(0)
                if global_step == 10:
                    probe.event("ready")
            global_step += 1
    if rank == 0:
        probe.event("train_end")
    dist.destroy_process_group()  # "cleaning up ddp environment"


def main() -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    epochs = probe.rng().randint(8, 16)  # 16 steps an epoch per rank
    hparams = {"lr": 0.05, "batch_size": 16, "epochs": epochs}
    logger = WandbLogger(project="wandb_pytorch_lightning_combo")
    mp.spawn(new_process, args=(logger, epochs, hparams), nprocs=NUM_PROCESSES)  # type: ignore[attr-defined]
    logger.finalize("success")


if __name__ == "__main__":
    main()
