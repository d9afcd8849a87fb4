"""Lightning-AI/pytorch-lightning#6106 through wandb-funnel: ``ddp_spawn`` with a W&B logger.

https://github.com/Lightning-AI/pytorch-lightning/issues/6106 ("pl+wandb: Hanging during
'cleaning up ddp environment' when using DDPSpawnPlugin + WandbLogger")

The same Lightning stand-in as ``report_lightning6106_plain.py`` (Lightning is not installed:
the script does what ``WandbLogger`` and the ddp_spawn strategy do), with the logger's run
made by ``wf.init`` instead of ``wandb.init``:
- the run is created in the main process, which becomes the funnel's owner; the logger is
  pickled into the ``torch.multiprocessing.spawn`` workers, and the ``wf.Run`` inside it
  attaches each worker as a rank of its own on first use (no ``wandb._attach``);
- each rank joins a gloo process group and trains a DDP model; since the funnel merges
  ranks, ``log_metrics`` is not ``rank_zero_only`` here: every rank logs every step
  (``train_loss`` is the mean of the ranks), and rank 0 logs the hyperparameters;
- after ``spawn`` returns, the main process calls ``logger.finalize("success")`` (which does
  not finish the run) and exits: the funnel's atexit hook closes it.

The job must exit soon after training, with every ``r0``/``r1`` record in the run and exit
code 0, and nothing left behind.

Run: ``python report_lightning6106_funnel.py`` (it spawns its 2 ranks itself; gloo on CPU).
Slot = rank; ranks 0 and 1 log (``r0``, ``r1``).
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
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import wandb_funnel as wf
from wandb_funnel.soak import probe

NUM_PROCESSES = 2


class WandbLogger:
    """What ``pytorch_lightning.loggers.WandbLogger`` does with ddp_spawn, on a ``wf.Run``."""

    def __init__(self, project: str, **kwargs: Any) -> None:
        self._wandb_init = {"project": project, **kwargs}
        self._experiment: wf.Run | None = None
        self.rank = 0  # set by the strategy in each spawned process

    def __getstate__(self) -> dict[str, Any]:
        # Lightning's hack, kept: create the run in the main process before the logger is
        # pickled into the spawned workers. A wf.Run pickles to its funnel's address.
        _ = self.experiment
        return self.__dict__.copy()

    @property
    def experiment(self) -> wf.Run:
        if self._experiment is None:
            self._experiment = wf.init(**self._wandb_init)
        return self._experiment

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        if self.rank == 0:
            self.experiment.config.update(params)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.experiment.log(metrics, step=step)  # every rank: the funnel merges them

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
            logger.log_metrics(
                {"train_loss": loss.item(), "epoch": epoch, f"r{rank}": global_step},
                step=global_step,
            )
            probe.count(rank)
            if rank == 0 and global_step == 10:
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
