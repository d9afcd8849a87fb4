"""A funnel job counts its wandb-core processes (issue 35: one per funnel).

    python one_core.py count [--installed]

The owner and two spawn workers log; while the workers run, the owner counts the wandb-core
processes below itself (psutil) and REPORTs them. ``--installed``: the plain wandb API, as
``wandb-funnel run -- python one_core.py count --installed`` runs it (the owner's
``wandb.init`` is the funnel's).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable

import psutil
from _prelude import Scenarios, option, report

scenario = Scenarios(__doc__)


def _work(i: int, installed: bool) -> None:
    if installed:
        import wandb

        run = wandb.init()
        for s in range(100):
            run.log({f"w{i}": s}, step=s)
            time.sleep(0.01)
        run.finish()
    else:
        import wandb_funnel as wf

        wrun = wf.init()
        for s in range(100):
            wrun.log({f"w{i}": s}, step=s)
            time.sleep(0.01)
        wf.finish()


def _cores() -> list[int]:
    """The pids of the wandb-core processes below this one."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "wandb-core" in proc.name():
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


@scenario(option("--installed", action="store_true"))
def count(args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    owner_close: Callable[[], object]
    if args.installed:
        import wandb

        run = wandb.init(project="one-core")
        owner_close = run.finish
    else:
        import wandb_funnel as wf

        funnel = wf.Funnel(project="one-core")
        funnel.__enter__()

        def owner_close() -> object:
            funnel.__exit__(None, None, None)
            return None

    workers = [ctx.Process(target=_work, args=(i, args.installed)) for i in (1, 2)]
    for worker in workers:
        worker.start()
    time.sleep(1.0)  # the workers attached and logging
    report(cores=_cores())
    for worker in workers:
        worker.join()
    report(workers_exit=[w.exitcode for w in workers])
    owner_close()


if __name__ == "__main__":
    scenario.main()
