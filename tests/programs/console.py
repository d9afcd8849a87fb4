"""One rank of tests/processes/test_console.py, under real torchrun (gloo on CPU): what it
prints, warns and logs must reach the run's Logs tab, labelled with its rank.

    torchrun --nproc-per-node 2 --standalone console.py BEHAVIOUR [--plain]

BEHAVIOUR: ``talk`` (each rank prints, warns, logs with ``logging`` and draws a ``\\r``
progress bar, logs metrics; through the funnel, it also samples its system metrics twice a
second for 2.5 s), ``stats`` (the ranks busy for 2.5 s, sampled twice a second), ``raise``
(the same as talk, then rank 1 raises), ``flood`` (rank 1 prints ``--lines`` lines as fast
as it can). ``--plain``: plain wandb in rank 0 only.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from typing import Any

import torch.distributed as dist
from _prelude import report


def talk(run: Any, rank: int) -> None:
    print(f"stdout line of rank {rank}")
    print(f"stderr line of rank {rank}", file=sys.stderr)
    warnings.warn(f"a warning of rank {rank}", stacklevel=1)
    logging.getLogger("train").warning("a logging record of rank %d", rank)
    for i in range(3):
        print(f"\rprogress {i}/3 of rank {rank}", end="", flush=True)
    print()
    for step in range(3):
        if run is not None:
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("behaviour", choices=["talk", "raise", "flood", "stats"])
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--lines", type=int, default=30_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run: Any
    if args.plain:
        import wandb

        run = wandb.init(project="console", name="console") if rank == 0 else None
    else:
        import wandb_funnel as wf

        sample = args.behaviour in ("talk", "stats")  # every rank's system metrics, twice a second
        settings = {"x_stats_sampling_interval": 0.5} if sample else None
        run = wf.init(project="console", name="console", settings=settings)
    dist.barrier()
    if args.behaviour == "stats":
        busy = time.monotonic() + 2.5  # work for the sampler to see, on every rank
        while time.monotonic() < busy:
            sum(range(10_000))
    elif args.behaviour == "flood":
        # Before the flood: every line rank 1 prints after it is in the count.
        report(**{f"flooded_{rank}": True})
        if rank == 1:
            for i in range(args.lines):
                # One write a line: rank 0's REPORT line shares torchrun's stdout, and must
                # not land between a line and its newline (print writes them separately).
                sys.stdout.write(f"flood {i}\n")
    else:
        talk(run, rank)
        if args.behaviour == "talk" and not args.plain:
            time.sleep(2.5)  # a few samples of each rank's metrics (asleep: a side-by-side
            # plain job keeps the CPU; the stats behaviour keeps the ranks busy instead)
    if args.behaviour == "raise":
        if rank == 1:
            raise RuntimeError("rank 1 gives up")
    else:
        dist.barrier()
    if run is not None:
        run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
