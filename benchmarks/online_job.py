"""A user's training script written for plain wandb, run as it is (``plain``) or unchanged
under ``wandb-funnel run --`` (``funnel``) by ``benchmarks/online_faults.py``.

Logs ``JOB_ROWS`` rows (default 20), ``JOB_PAUSE`` seconds apart (default 0.2), then
finishes. With ``JOB_HOLD=PATH`` it touches ``PATH.ready`` after the last row and waits (at
most 60 s) until ``PATH`` exists before ``finish()``: the driver stalls the server then.
Prints ``REPORT {"run_id": ...}`` once ``wandb.init`` returned, with how long it took.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import wandb


def main() -> None:
    rows = int(os.environ.get("JOB_ROWS", "20"))
    pause = float(os.environ.get("JOB_PAUSE", "0.2"))
    hold = os.environ.get("JOB_HOLD")
    t0 = time.monotonic()
    run = wandb.init(config={"lr": 0.1})
    print("REPORT " + json.dumps({"run_id": run.id, "init_s": time.monotonic() - t0}), flush=True)
    for step in range(rows):
        run.log({"loss": 1.0 / (step + 1), "acc": step / rows}, step=step)
        if step == 0:  # the wall clock, for a driver that started this process
            print("REPORT " + json.dumps({"first_log_at": time.time()}), flush=True)
        time.sleep(pause)
    if hold:
        pathlib.Path(hold + ".ready").touch()
        deadline = time.monotonic() + 60
        while not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.05)
    run.finish()
    print("REPORT " + json.dumps({"finished_s": time.monotonic() - t0}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
