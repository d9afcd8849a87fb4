"""The W&B docs' "Share a run" pattern, ported: a Run passed to spawned children.

The owner makes the run; each child receives the Run object and logs through it (as a rank of
its own). Keys logged by several children at the same step are reduced (mean).

    python examples/share_run.py --children 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp

import wandb_funnel as wf


def child(run: wf.Run, index: int) -> None:
    for step in range(20):
        run.log({"child_metric": index * 100 + step, f"child{index}/seen": step}, step=step)
    run.finish()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=2)
    args = parser.parse_args(argv)
    run = wf.init(project="wandb-funnel-demo")  # no funnel around: starts one, owns it
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=child, args=(run, i)) for i in range(args.children)]
    for p in procs:
        p.start()
    for step in range(20):
        run.log({"owner_metric": step}, step=step)
    for p in procs:
        p.join(timeout=60)
    run.finish()
    print(
        f"run {run.id}: owner + {args.children} children; exit codes {[p.exitcode for p in procs]}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
