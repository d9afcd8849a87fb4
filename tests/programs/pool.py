"""The owner processes of tests/processes/test_pool.py: multiprocessing children logging.

    python pool.py SCENARIO [--method spawn|forkserver|fork]      (``--help`` lists them)

Each prints what it saw as REPORT lines; the test reads those and the run's ``.wandb`` file.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

from _prelude import Scenarios, option, report

import wandb_funnel as wf

scenario = Scenarios(__doc__)


def work(n: int) -> int:
    wf.log({"score": n * n}, step=n)
    return os.getpid()


@scenario(option("--method", choices=["spawn", "forkserver", "fork"], required=True))
def pool_workers(args: argparse.Namespace) -> None:
    """A Pool of 3 maps 60 steps through wf.log; REPORT how many workers took part."""
    with wf.Funnel(project="t") as funnel:
        report(address=funnel.address, logger_pid=funnel.logger_pid)
        funnel.log({"lr": 0.1}, step=0)
        with mp.get_context(args.method).Pool(3) as pool:
            pids = pool.map(work, range(60), chunksize=4)
    report(stats=funnel.stats, workers=len(set(pids)))


def inherited_run_child(run: wf.Run) -> None:
    run.log({"via_inherited_run": 1}, step=1)
    wf.log({"via_wf_log": 2}, step=2)


@scenario()
def fork_child(args: argparse.Namespace) -> None:
    """A forked child logs through the owner's Run object and through wf.log."""
    with wf.Funnel(project="t") as funnel:
        funnel.log({"owner": 0}, step=0)  # the owner's socket exists before the fork
        ctx = mp.get_context("fork")
        p = ctx.Process(target=inherited_run_child, args=(funnel.run,))
        p.start()
        p.join(30)
        funnel.log({"owner": 3}, step=3)
    report(exitcode=p.exitcode, stats=funnel.stats)


@scenario()
def socket_dir(args: argparse.Namespace) -> None:
    """REPORT the IPC socket's directory mode while the funnel runs."""
    with wf.Funnel(project="t") as funnel:
        path = funnel.address[len("ipc://") :]
        st = os.stat(os.path.dirname(path))
        report(mode=st.st_mode & 0o777, exists=os.path.exists(path), path=path)


@scenario(option("--method", choices=["spawn", "forkserver"], required=True))
def child_logs_while_unpickled(args: argparse.Namespace) -> None:
    """A child whose target's module (logs_at_import.py) logs as the child imports it."""
    os.environ["OWNER_PID"] = str(os.getpid())
    with wf.Funnel(project="t") as funnel:
        import logs_at_import  # here, so that the forkserver does not preload it

        child = mp.get_context(args.method).Process(target=logs_at_import.target)
        child.start()
        child.join()
    report(stats=funnel.stats, child_exit=child.exitcode)


if __name__ == "__main__":
    scenario.main()
