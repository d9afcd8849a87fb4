"""A user's training script as ``wandb-funnel soak -- python soak_user.py`` runs it: it knows
nothing of the soak harness (no probe). The owner opens the run, one spawn worker logs into
it for a few seconds, the owner reports how the worker ended and finishes the run.

    python soak_user.py [--seconds S] [--hang-on-exit]

- ``--hang-on-exit``: once the run is finished, a non-daemon thread that never ends keeps the
  interpreter from exiting (the harness must report a hang).

Run by ``tests/soak/test_user_command.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time

import wandb_funnel as wf


def work(seconds: float) -> None:
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        wf.log({"loss": 1.0 / (step + 1)}, step=step)
        step += 1
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--hang-on-exit", action="store_true")
    args = parser.parse_args()
    run = wf.init(project="soak-user")
    worker = mp.get_context("spawn").Process(target=work, args=(args.seconds,))
    worker.start()
    worker.join()
    print(f"worker exit code {worker.exitcode}", flush=True)
    run.finish()
    if args.hang_on_exit:
        threading.Thread(target=time.sleep, args=(3600,)).start()  # exit waits for it


if __name__ == "__main__":
    main()
