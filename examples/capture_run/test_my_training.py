"""A user's own pytest file: ``capture_run`` checks what ``my_training.train`` logs, with no
wandb run, no wandb-core and no network.

    python -m pytest examples/capture_run/test_my_training.py

``install()`` inside the block puts the funnel under the plain wandb code, as ``wandb-funnel
run`` does for the real job; the funnel runs for real (its logger process, the workers'
sockets, ordering, reducers, accounting) and writes to a recording instead of wandb, so
``cap`` holds what wandb would have been given.
"""

from __future__ import annotations

from my_training import train

import wandb_funnel
from wandb_funnel.testing import capture_run


def test_every_worker_logs_its_loss_at_every_step() -> None:
    with capture_run() as cap:
        # The funnel under wandb's calls, as `wandb-funnel run --reduce samples=sum` puts it;
        # and each step's row waits for a worker that starts late (a loaded CI machine) up to
        # a minute, not the 2 s default: the rows are the same on any machine.
        wandb_funnel.install(reduce={"samples": "sum"}, reorder_window=60)
        try:
            train(steps=10, workers=2)
        finally:
            wandb_funnel.uninstall()
    assert [row["_step"] for row in cap.rows] == list(range(10))
    for row in cap.rows:  # the keys the dashboard's charts use, at every step
        assert {"loss", "samples"} <= row.keys(), f"step {row['_step']} has {sorted(row)}"
    assert [row["samples"] for row in cap.rows] == [64] * 10  # both workers, summed
    assert cap.rows[0]["lr"] == 0.1
    assert cap.rows[-1]["loss"] < cap.rows[0]["loss"]  # it went down
    assert cap.config["lr"] == 0.1 and cap.summary["shards"] == 2
    # Nothing was dropped or came too late, and every process reached the run.
    assert cap.summary["_funnel/ranks"] == 3  # the main process and two workers
    assert cap.summary["_funnel/dropped_records"] == 0
    assert cap.summary["_funnel/late_records"] == 0
    assert cap.exit_code == 0
