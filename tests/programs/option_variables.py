"""The owner processes of tests/processes/test_option_variables.py: a ``WANDB_FUNNEL_*``
variable acts through every entry point (issue 35, item 2). No scenario passes an option as
a keyword: whatever the run shows of one came from the environment (or a flag).

    python option_variables.py funnel|init|install|plain

- ``funnel`` (``wf.Funnel``), ``init`` (``wf.init``, a private funnel), ``install``
  (``wandb_funnel.install()`` and ``wandb.init``) and ``plain`` (``wandb.init`` alone: run
  under ``wandb-funnel run``): this process logs ``x`` = 1 at steps 0-2 as rank 0, and a
  spawned child, attaching with the same call, logs ``x`` = 2 at the same steps, once both
  are attached; REPORTs the child's exit code.

(Under torchrun: ``health.py stall --options-from-env``.)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from typing import Any

from _prelude import Scenarios, report

import wandb_funnel as wf

scenario = Scenarios(__doc__)
STEPS = 3


def _log(log: Callable[..., Any], value: int) -> None:
    for step in range(STEPS):
        log({"x": value}, step=step)


def _child(way: str, barrier: Barrier) -> None:
    if way in ("funnel", "init"):
        run = wf.init()
        barrier.wait(60)
        _log(run.log, 2)
        run.finish()
    else:
        import wandb  # installed in this child: by sitecustomize, exported from the parent

        wandb.init(project="options")
        barrier.wait(60)
        _log(wandb.log, 2)
        wandb.finish()


def _with_a_child(way: str, log: Callable[..., Any]) -> None:
    """Both ranks log once both are attached: rows wait for every rank the logger knows."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    child = ctx.Process(target=_child, args=(way, barrier))
    child.start()
    barrier.wait(60)
    _log(log, 1)
    child.join(60)
    report(child=child.exitcode)


@scenario()
def funnel(args: argparse.Namespace) -> None:
    """wf.Funnel, its options from the environment."""
    with wf.Funnel(project="options") as owner:
        _with_a_child("funnel", owner.log)


@scenario()
def init(args: argparse.Namespace) -> None:
    """wf.init with no funnel around: a private one, its options from the environment."""
    run = wf.init(project="options")
    _with_a_child("init", run.log)
    run.finish()


@scenario()
def install(args: argparse.Namespace) -> None:
    """wandb_funnel.install() with no options, then plain wandb calls."""
    wf.install()
    import wandb

    wandb.init(project="options")
    _with_a_child("install", wandb.log)
    wandb.finish()


@scenario()
def plain(args: argparse.Namespace) -> None:
    """Plain wandb calls only (installed by `wandb-funnel run`)."""
    import wandb

    wandb.init(project="options")
    _with_a_child("plain", wandb.log)
    wandb.finish()


if __name__ == "__main__":
    scenario.main()
