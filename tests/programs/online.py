"""The owner processes of tests/online/test_funnel_online.py: a funnel whose run is online
(``WANDB_MODE=online``, ``WANDB_BASE_URL`` and ``WANDB_PROJECT`` from the test), with spawned
workers that log as ranks.

    python online.py ranks [--workers N] [--steps S] [--start-timeout T] ...

Prints what it saw as REPORT lines: the run's id, directory and mode, the funnel's
accounting, and how long the owner's start and its slowest ``log()`` took.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pathlib
import time
from typing import Any

from _prelude import Scenarios, option, report

import wandb_funnel as wf

scenario = Scenarios(__doc__)


def worker(steps: int, barrier: Any, pause: float) -> None:
    run = wf.init()
    barrier.wait(60)
    slowest = 0.0
    for step in range(steps):
        t0 = time.perf_counter()
        run.log({"loss": 1.0 / (step + 1), f"w{run.rank}": step}, step=step)
        slowest = max(slowest, time.perf_counter() - t0)
        if pause:
            time.sleep(pause)
    report(rank=run.rank, slowest_log_s=slowest)
    run.finish()


@scenario(
    option("--workers", type=int, default=2),
    option("--steps", type=int, default=20),
    option("--start-timeout", type=float, default=90.0),
    option("--close-timeout", type=float, default=30.0),
    option("--on-network-error", default="offline"),
    option("--step-pause", type=float, default=0.0),
    option(
        "--hold",
        default=None,
        help="before the close: once the run is open, touch "
        "HOLD.ready and wait (at most 60 s) until HOLD exists",
    ),
)
def ranks(args: argparse.Namespace) -> None:
    """The owner (rank 0) and ``--workers`` spawned ranks log ``--steps`` steps each."""
    t0 = time.perf_counter()
    funnel = wf.Funnel(
        start_timeout=args.start_timeout,
        close_timeout=args.close_timeout,
        on_network_error=args.on_network_error,
        config={"lr": 0.1, "workers": args.workers},
    )
    with funnel:
        started = time.perf_counter() - t0
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(args.workers + 1)
        procs = [
            ctx.Process(target=worker, args=(args.steps, barrier, args.step_pause))
            for _ in range(args.workers)
        ]
        for p in procs:
            p.start()
        run = funnel.run
        run._attach(30)
        barrier.wait(60)
        slowest = 0.0
        for step in range(args.steps):
            t1 = time.perf_counter()
            run.log({"loss": 1.0 / (step + 1), "w0": step}, step=step)
            slowest = max(slowest, time.perf_counter() - t1)
            if args.step_pause:
                time.sleep(args.step_pause)
        run.summary["best"] = 1.0
        for p in procs:
            p.join(120)
        if args.hold:
            assert run.dir  # waits until the run is open
            pathlib.Path(args.hold + ".ready").touch()
            deadline = time.monotonic() + 60
            while not os.path.exists(args.hold) and time.monotonic() < deadline:
                time.sleep(0.05)
    # After the close: reading them before would wait for a run still opening in the
    # background (as wandb.init waits), and the test times the job.
    report(
        run_id=funnel.run_id,
        dir=run.dir,
        offline=run.offline,
        url=run.url,
        start_s=started,
        slowest_log_s=slowest,
        stats=funnel.stats,
        exit_codes=[p.exitcode for p in procs],
    )


if __name__ == "__main__":
    scenario.main()
