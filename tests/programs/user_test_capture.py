"""A user's own test file, as the README's "Testing your logging" shows it: capture_run()
around a Funnel and two spawned workers. tests/processes/test_capture.py runs it with pytest
in a process of its own and checks what it leaves behind (no wandb import, no run files)."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import tempfile

import wandb_funnel as wf
from wandb_funnel.testing import capture_run


def worker(rank: int) -> None:
    for step in range(20):
        data: dict[str, object] = {"loss": float(rank + step), f"w{rank}": step}
        if rank == 1 and step == 0:
            data["h1"] = wf.Histogram(np_histogram=([1, 2], [0.0, 1.0, 2.0]))
        wf.log(data, step=step)
    print(f"worker {rank} done", flush=True)


def test_every_rank_reaches_the_capture_and_wandb_is_never_imported() -> None:
    with capture_run() as cap:
        with wf.Funnel(project="p", config={"lr": 0.1}, reduce={"loss": "sum"}) as funnel:
            funnel.log({"lr": 0.1}, step=0)
            with tempfile.TemporaryDirectory() as saved:
                with open(os.path.join(saved, "notes.txt"), "w") as f:
                    f.write("hello")
                funnel.run.save(os.path.join(saved, "notes.txt"), base_path=saved)
            ctx = mp.get_context("spawn")
            workers = [ctx.Process(target=worker, args=(r,)) for r in range(2)]
            for p in workers:
                p.start()
            for p in workers:
                p.join(60)
            assert [p.exitcode for p in workers] == [0, 0]
    assert [row["_step"] for row in cap.rows] == list(range(20))
    assert [row["loss"] for row in cap.rows] == [float(2 * s + 1) for s in range(20)]  # sum
    assert [row["w1"] for row in cap.rows] == list(range(20))
    assert cap.rows[0]["lr"] == 0.1
    # Media as descriptors, saved files by name and size.
    assert cap.rows[0]["h1"] == {"_type": "histogram", "values": [1, 2], "bins": [0.0, 1.0, 2.0]}
    assert cap.files == [{"op": "save", "name": "notes.txt", "size": 5}]
    assert cap.summary["_funnel/files"] == 1 and cap.summary["_funnel/dropped_files"] == 0
    assert cap.config["lr"] == 0.1
    assert cap.summary["_funnel/records"] == 41 and cap.summary["_funnel/dropped_records"] == 0
    assert cap.exit_code == 0
    assert "worker 1 done\n" in cap.console_text
    assert cap.summary["_funnel/ranks"] == 3  # the owner and two workers
    assert "wandb" not in sys.modules
    # Nothing of wandb's on disk: no wandb/ directory in the working directory.
    assert not os.path.exists("wandb")
