"""The owner processes of tests/processes/test_restart.py: a part of the funnel dies mid-run.

    python restart.py kill-mid-run --kill logger|core|owner|none [--times N] [--max-restarts N]
        [--lag S] [--at STEP] [--attributes]

Two spawn workers log ``{"loss", "w<i>"}`` at each of ``--steps`` steps, ``--delay`` apart
(worker 2 attaches ``--lag`` seconds after worker 1: far behind it, its records are late;
with ``--attributes`` it sets ``run.name``, ``notes`` and ``tags`` first).
Once both are past step ``--at`` (150) the owner SIGKILLs the logger, the logger's wandb-core,
or itself, as an OOM kill would; a later kill waits for the new logger, and 50 more steps.
It REPORTs what it killed and, if it lives, the funnel's accounting; the test reads every
segment of the run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import time
from typing import Any

from _prelude import Scenarios, option, report

import wandb_funnel as wf

scenario = Scenarios(__doc__)
ATTRIBUTES = ("set-by-rank-2", "notes of rank 2", ["r2", "restart"])  # with --attributes


def work(
    i: int,
    progress: Any,
    steps: int,
    delay: float,
    media: bool = False,
    lag: float = 0.0,
    attributes: bool = False,
    attached: Any = None,
) -> None:
    time.sleep(lag)
    run = wf.init()  # attaches to the owner's funnel (its address is in the environment)
    assert run.rank is not None  # says hello now: the logger's rows wait for it from here
    if attached is not None:
        # Both workers attached before either logs: rows then wait for both (a worker that
        # a loaded machine starts seconds after the other would make late rows, which are
        # reorder_window's business, not a restart's; --lag tests those on purpose).
        attached.wait(timeout=120)
    if attributes and i == 2:  # a restarted logger's segment must say them too
        run.name, run.notes, run.tags = ATTRIBUTES[0], ATTRIBUTES[1], ATTRIBUTES[2]
    for step in range(steps):
        data: dict[str, Any] = {"loss": step * 0.1, f"w{i}": step}
        if media and step % 10 == 0:  # an image of its own every 10 steps
            import numpy as np

            pixels = np.full((8, 8, 3), (step // 10) % 256, dtype=np.uint8)
            data[f"img{i}"] = wf.Image(pixels, caption=f"w{i} step {step}")
        run.log(data, step=step)
        progress[i] = step
        time.sleep(delay)
    run.finish()


def _children(pid: int) -> list[tuple[int, bytes]]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append((int(entry), cmd))
    return out


def _wandb_core_of(pid: int, timeout: float = 30.0) -> int:
    """The wandb-core the logger ``pid`` started (its child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child, cmd in _children(pid):
            if b"wandb-core" in cmd:
                return child
        time.sleep(0.05)
    raise RuntimeError(f"no wandb-core under the logger {pid}")


def _wait(cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


@scenario(
    option("--kill", choices=["none", "logger", "core", "owner"], required=True),
    option("--times", type=int, default=1),
    option("--steps", type=int, default=600),
    option("--delay", type=float, default=0.005),
    option("--max-restarts", type=int, default=3),
    option("--media", action="store_true"),
    option("--lag", type=float, default=0.0),
    option("--at", type=int, default=150),
    option("--attributes", action="store_true"),
)
def kill_mid_run(args: argparse.Namespace) -> None:
    ctx = mp.get_context("spawn")
    progress = ctx.Array("i", [-1, -1, -1], lock=False)
    attached = ctx.Barrier(2) if not args.lag else None
    with wf.Funnel(project="restart", max_logger_restarts=args.max_restarts) as funnel:
        report(run_id=funnel.run_id)
        workers = [
            ctx.Process(
                target=work,
                args=(
                    i,
                    progress,
                    args.steps,
                    args.delay,
                    args.media,
                    args.lag * (i == 2),
                    args.attributes,
                    attached,
                ),
            )
            for i in (1, 2)
        ]
        for worker in workers:
            worker.start()
        killed = []
        at = args.at
        for k in range(args.times if args.kill != "none" else 0):
            _wait(lambda at=at: min(progress[1], progress[2]) >= at, f"both workers at {at}")
            logger = funnel.logger_pid
            assert logger is not None
            if args.kill == "owner":
                report(killed=[("owner", os.getpid())])
                os.kill(os.getpid(), signal.SIGKILL)
            target = logger if args.kill == "logger" else _wandb_core_of(logger)
            os.kill(target, signal.SIGKILL)
            killed.append((args.kill, target))
            if k + 1 < args.times:  # the next kill: of the new logger, once the workers
                # have logged 50 more steps with it up
                _wait(lambda old=logger: funnel.logger_pid != old, "a new logger")
                # (at the last step at most: a slow takeover, wandb 0.25's 6.5 s, can find
                # the workers near their end; the next death then comes after their last log)
                at = min(max(progress[1], progress[2]) + 50, args.steps - 1)
        report(killed=killed)
        for worker in workers:
            worker.join()
        report(workers_exit=[w.exitcode for w in workers])
    report(stats=funnel.stats, restarts=funnel.logger_restarts)


if __name__ == "__main__":
    scenario.main()
