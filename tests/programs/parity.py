"""A one-process training script, run by tests/processes/test_parity.py with plain wandb,
under ``wandb-funnel run --`` and with ``install()`` as its first line: what a user sees of
its run (Logs, System, terminal, footer, telemetry, exit record) must be the same.

    python parity.py [--install] [--flood LINES]

It writes as HF's Trainer does: a progress bar redrawn with ``\\r`` on stderr, with
``{'loss': ...}`` lines printed on stdout between its redraws; logs 14 keys (more than
wandb's footer shows); holds 300 MB and keeps a core busy for the System tab.
``--flood``: prints that many lines as fast as it can at the end (the funnel drops some of
them, counted, and must say so on the terminal).
"""

from __future__ import annotations

import sys
import time

if "--install" in sys.argv:
    import wandb_funnel

    wandb_funnel.install()

import torch  # noqa: F401  (wandb's telemetry lists it among the caller's imports)
import wandb
from _prelude import report

STEPS = 6


def main() -> None:
    flood = int(sys.argv[sys.argv.index("--flood") + 1]) if "--flood" in sys.argv else 0
    before = time.time()
    run = wandb.init(project="parity", name="parity", config={"lr": 0.1})
    report(init_called=before, init_returned=time.time())
    for step in range(STEPS):
        bar = "#" * step + " " * (STEPS - step)
        sys.stderr.write(f"\r{100 * step // STEPS:3d}%|{bar}| {step}/{STEPS}")
        sys.stderr.flush()
        if step % 2:
            print({"loss": round(1 / (step + 1), 4), "epoch": step})
        run.log({"loss": 1 / (step + 1), "lr": 0.1, f"k{step:02d}": step, f"m{step:02d}": 2})
    sys.stderr.write(f"\r100%|{'#' * STEPS}| {STEPS}/{STEPS}\n")
    print("an unfinished line", end="", flush=True)
    print(" ends here")
    print("a line on stderr", file=sys.stderr)
    ballast = bytearray(300 * 2**20)
    for i in range(0, len(ballast), 4096):  # touched: resident
        ballast[i] = 1
    busy = time.monotonic() + 2.5  # for the sampler (0.5 s) to see, a few times
    while time.monotonic() < busy:
        sum(range(10_000))
    for i in range(flood):
        sys.stdout.write(f"flood {i}\n")
    run.finish()
    del ballast


if __name__ == "__main__":
    main()
