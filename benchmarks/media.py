"""Images through the funnel against plain ``wandb.log`` of the same image (64x64 RGB).

    python benchmarks/media.py --images N

Three modes, one after another in fresh interpreters of this script:
- ``plain``: ``run.log({"img": wandb.Image(array)})`` in the process, plain wandb offline;
- ``funnel``: ``run.log({"img": wf.Image(array)})`` from a funnel rank (the PNG is encoded in
  the rank, the file staged by name, the logger process logs it);
- ``funnel-wandb``: ``run.log({"img": wandb.Image(array)})`` from a funnel rank (wandb encodes
  it in the rank; its file is hard-linked into the staging directory).

Per mode: ``worker_us``, the median cost of one image to the logging process (making the
image object and the ``log`` call); ``images_per_s``, images written into the run per second,
from the first ``log`` to the run finished (for the funnel, that is the logger's throughput:
the rank's calls return long before).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np
from _common import report


def one(mode: str, images: int) -> dict[str, Any]:
    array = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    import wandb

    costs = []
    if mode == "plain":
        run = wandb.init(project="bench-media", mode="offline")
        start = time.perf_counter()
        for i in range(images):
            t0 = time.perf_counter()
            run.log({"img": wandb.Image(array), "i": i})
            costs.append(time.perf_counter() - t0)
        run.finish()
        done = time.perf_counter()
    else:
        import wandb_funnel as wf

        funnel = wf.Funnel(project="bench-media", close_timeout=600).start()
        make = wf.Image if mode == "funnel" else wandb.Image
        start = time.perf_counter()
        for i in range(images):
            t0 = time.perf_counter()
            funnel.run.log({"img": make(array), "i": i}, step=i)
            costs.append(time.perf_counter() - t0)
        funnel.close()
        done = time.perf_counter()
        assert funnel.stats is not None and funnel.stats["_funnel/media"] == images, funnel.stats
    return {"worker_us": statistics.median(costs) * 1e6, "images_per_s": images / (done - start)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # one measurement (a child)
    args = parser.parse_args()
    if args.mode:
        print("MODE " + json.dumps(one(args.mode, args.images)), flush=True)
        return
    figures: dict[str, Any] = {"images": args.images}
    for mode in ("plain", "funnel", "funnel-wandb"):
        proc = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--images", str(args.images)],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
            env=os.environ,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MODE ")]
        if not lines:
            raise RuntimeError(
                f"{mode} reported nothing (exit {proc.returncode})\n{proc.stderr[-3000:]}"
            )
        figures[mode] = json.loads(lines[0][len("MODE ") :])
    figures["ratio_worker"] = figures["funnel"]["worker_us"] / figures["plain"]["worker_us"]
    figures["ratio_throughput"] = (
        figures["funnel"]["images_per_s"] / figures["plain"]["images_per_s"]
    )
    report(**figures)


if __name__ == "__main__":
    main()
