"""Workers log as fast as they can for a few seconds: far faster than wandb writes rows.

The logger falls behind (and the harness may stall wandb-core outright); memory on both
sides must stay bounded, every record must be logged or counted as dropped, and the workers'
logging rate must not depend on how far behind the logger is.
"""

from __future__ import annotations

import multiprocessing as mp

from _work import flat_out

import wandb_funnel as wf
from wandb_funnel.soak import probe


def main() -> None:
    rng = probe.rng()
    seconds = rng.uniform(4, 6)
    ctx = mp.get_context("spawn")
    with wf.Funnel(project="soak", close_timeout=6):
        procs = [ctx.Process(target=flat_out, args=(slot, seconds)) for slot in (1, 2)]
        for p in procs:
            p.start()
        probe.event("ready")
        for p in procs:
            p.join()
        probe.event("train_end")


if __name__ == "__main__":
    main()
