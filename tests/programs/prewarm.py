"""A logger started ahead of time (``_owner/prewarm.py``), as an installed script meets it.

    python prewarm.py SCENARIO      (``--help`` lists them)

Every scenario runs installed (``wandb_funnel.install()`` exported, as ``wandb-funnel run``
does: the program is started with ``_WANDB_FUNNEL_INSTALL`` set) and imports wandb.
"""

from __future__ import annotations

import argparse
import os
import pathlib

from _prelude import Scenarios, report

scenario = Scenarios(__doc__)


def _warm_pid() -> int | None:
    from wandb_funnel._owner import prewarm

    warm = prewarm._warm
    return warm.proc.pid if warm is not None else None


@scenario()
def never_init(args: argparse.Namespace) -> None:
    """Imports wandb and never calls wandb.init: the logger started ahead of time is gone
    once this process has exited (the test looks for it)."""
    import wandb  # noqa: F401

    report(warm_pid=_warm_pid())


@scenario()
def init_late(args: argparse.Namespace) -> None:
    """The environment and directory change between ``import wandb`` and ``wandb.init``; a
    forked child comes and goes meanwhile. The run takes them as they are at init, and its
    logger is the one started ahead of time."""
    import wandb

    warm = _warm_pid()
    child = os.fork()
    if child == 0:
        os._exit(0)  # a forked child: its copy of the logger's pipe is closed at fork
    os.waitpid(child, 0)
    os.environ["WANDB_PROJECT"] = "set-after-import"
    later = pathlib.Path("later")
    later.mkdir()
    os.chdir(later)
    run = wandb.init(name="late", dir=".")  # the directory of the init, not of the import
    run.log({"x": 1})
    logger_pid = run._info.logger_pid  # type: ignore[attr-defined]
    run_dir = run.dir
    run.finish()
    report(warm_pid=warm, logger_pid=logger_pid, run_dir=run_dir, cwd=os.getcwd())


if __name__ == "__main__":
    scenario.main()
