"""Lightning ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` with ``WandbLogger``,
under Lightning's own launcher (it starts the second process itself, with ``LOCAL_RANK``,
``NODE_RANK`` and ``WORLD_SIZE`` but no ``RANK``). ``save_hyperparameters()``, ``self.log``
of a train and a validation metric.
``CLIENT_FUNNEL_LOGGER=1`` swaps ``WandbLogger`` for ``wandb_funnel``'s ``FunnelLogger``.
A second argument names another strategy (``ddp_spawn``: Lightning spawns both ranks from
the main process, and each rank's ``WandbLogger`` calls ``wandb.init(id=..., resume="allow")``
for the run the main process made).

Plain Lightning code. ``CLIENT_INSTALL=1`` adds the one line a user adds: ``install()``.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("CLIENT_INSTALL") == "1":
    import wandb_funnel

    wandb_funnel.install()

import lightning as L  # noqa: N812  # Lightning's own convention
import torch
from _prelude import end_process_group_at_exit
from lightning.pytorch.loggers import WandbLogger

end_process_group_at_exit()


class Tiny(L.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(hidden, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])


def loader(seed: int) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)
    )
    return torch.utils.data.DataLoader(data, batch_size=8)


def main() -> None:
    L.seed_everything(0)
    logger_class = WandbLogger
    if os.environ.get("CLIENT_FUNNEL_LOGGER") == "1":
        from wandb_funnel.integrations.lightning import FunnelLogger

        logger_class = FunnelLogger
    logger = logger_class(name="pl-run", project="lightning", save_dir=sys.argv[1])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=sys.argv[2] if len(sys.argv) > 2 else "ddp",
        max_epochs=2,
        logger=logger,
        log_every_n_steps=2,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=sys.argv[1],
    )
    trainer.fit(Tiny(), loader(0), loader(1))


if __name__ == "__main__":
    main()
