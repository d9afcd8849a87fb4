"""A rank-0-only script whose steps are the user's own, as public scripts write them: an
explicit ``step=`` that skips (accelerate's ``accelerator.log(values, step=)``: 3, 6, 9, ...),
a ``global_step`` of its own on some rows only, its own step metric for ``eval/*``, a
``commit=False`` record, and a step-less log after the explicit steps. Plain wandb code;
``CLIENT_INSTALL=1`` adds ``install()``."""

from __future__ import annotations

import os

if os.environ.get("CLIENT_INSTALL") == "1":
    import wandb_funnel

    wandb_funnel.install()

import wandb


def main() -> None:
    run = wandb.init(project="steps", name="steps-run")
    run.define_metric("eval/*", step_metric="global_step")
    for i in range(6):
        step = 3 * (i + 1)
        run.log({"train/loss": 1.0 / (i + 1)}, step=step)
        if i % 2 == 1:  # the user's own global_step, on every other row only
            run.log({"eval/acc": float(i), "global_step": 100 * i}, step=step)
        run.log({"lr": 0.1}, commit=False)  # into the open row at this step
    run.log({"final": 1})  # step-less: into the open row, committed
    run.log({"after": 2})  # the next step
    run.finish()


if __name__ == "__main__":
    main()
