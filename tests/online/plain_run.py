"""Plain wandb (no funnel), online: the program the harness's own tests run.

    python tests/online/plain_run.py --rows 20 [--pause-after K --go FILE] [--exit-code N]

Logs ``--rows`` rows (``loss``, ``acc``; row ``rows - 1`` also an image), sets a summary value,
and finishes with ``--exit-code``. With ``--pause-after K`` it stops after K rows, reports
``paused_at``, and goes on once FILE exists (at most 60 s). Reports as ``REPORT {json}``
lines: ``run_id``, ``paused_at``, ``finish_s`` (how long ``finish`` took).

The filestream is tuned for short tests: a transmit every 0.5 s, retries after 0.5 to 2 s.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
import wandb


def settings() -> wandb.Settings:
    return wandb.Settings(
        x_file_stream_transmit_interval=0.5,
        x_file_stream_retry_wait_min_seconds=0.5,
        x_file_stream_retry_wait_max_seconds=2.0,
    )


def report(**values: object) -> None:
    print("REPORT " + json.dumps(values), flush=True)


def row(step: int) -> dict[str, float]:
    return {"loss": 1.0 / (step + 1), "acc": step / 100}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--pause-after", type=int, default=None)
    parser.add_argument("--go", type=pathlib.Path, default=None)
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()

    run = wandb.init(
        config={"lr": 0.1, "layers": [64, 32], "nested": {"a": 1}},
        settings=settings(),
    )
    report(run_id=run.id)
    for step in range(args.rows):
        if step == args.pause_after:
            report(paused_at=step)
            assert args.go is not None, "--pause-after needs --go"
            deadline = time.monotonic() + 60
            while not args.go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        data: dict[str, object] = dict(row(step))
        if step == args.rows - 1:
            data["img"] = wandb.Image(np.full((8, 8, 3), 200, dtype=np.uint8))
        run.log(data)
        print(f"logged row {step}", flush=True)
    run.summary["best"] = 42
    started = time.monotonic()
    run.finish(exit_code=args.exit_code)
    report(finish_s=time.monotonic() - started)


if __name__ == "__main__":
    main()
