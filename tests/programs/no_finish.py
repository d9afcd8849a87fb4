"""A script that never calls ``finish()``: its exit hook finishes the run. Plain wandb code;
``--install`` adds ``install()``."""

from __future__ import annotations

import sys

if "--install" in sys.argv:
    import wandb_funnel

    wandb_funnel.install()

import wandb

run = wandb.init(project="no-finish", name="no-finish-run")
for i in range(3):
    run.log({"loss": 1.0 / (i + 1)})
