"""The W&B docs' "Spawn process" pattern, ported: Pool workers each call ``init``.

In plain wandb every worker makes a run of its own (N runs, grouped afterwards). Here every
``wf.init()`` attaches to the one funnel: each task is a rank of its own, logging from step 0,
and the run gets every task's metrics under ``{key}/rank{rank}`` (run_mode="shared").

    python examples/spawn_process.py --tasks 8
"""

from __future__ import annotations

import argparse
import multiprocessing as mp

import wandb_funnel as wf


def task(index: int) -> int:
    with wf.init(config={f"task_{index}_seed": index}) as run:
        for step in range(10):
            run.log({"acc": index + step / 10})
        rank = run.rank
    return rank if rank is not None else -1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    args = parser.parse_args(argv)
    with wf.Funnel(project="wandb-funnel-demo", run_mode="shared") as funnel:
        with mp.get_context("spawn").Pool(2) as pool:
            ranks = pool.map(task, range(args.tasks))
    print(f"run {funnel.run_id}: tasks logged as ranks {sorted(ranks)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
