"""``run.name = ...``, ``run.notes = ...``, ``run.tags = [...]`` (issue 34, item 1): the same
script run with plain wandb and through the funnel, and the same values set from a spawn
worker, so that a test can compare what the runs wrote.

    python run_attributes.py script              (plain wandb code: run it as is, and under
                                                  ``wandb-funnel run --``)
    python run_attributes.py spawn-rank          (wf.init; a spawn worker sets them)
    python run_attributes.py cross-validation    (wandb's sweeps cross-validation example,
                                                  two folds: ``sweep_run.notes = ...``)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
from typing import Any

from _prelude import Scenarios, report

scenario = Scenarios(__doc__)

NAME, NOTES, TAGS = "renamed", "notes set mid-run", ["a", "b"]


def _set_and_read(run: Any) -> dict[str, Any]:
    """Set the three as a user does (and two bad values of each), then read them back."""
    run.name = NAME
    run.notes = NOTES
    run.tags = TAGS
    run.tags = ["", "ok"]  # wandb warns and keeps the tags the run had
    errors: dict[str, str | None] = {}
    for attr, value in (("name", 5), ("notes", 3), ("tags", 5)):
        try:
            setattr(run, attr, value)
            errors[attr] = None
        except ValueError:  # wandb's: pydantic's ValidationError, a ValueError
            errors[attr] = "ValueError"
        except TypeError:
            errors[attr] = "TypeError"
    return {"name": run.name, "notes": run.notes, "tags": list(run.tags), "errors": errors}


@scenario()
def script(args: argparse.Namespace) -> None:
    """Plain wandb code, one process."""
    import wandb

    run = wandb.init(project="attributes", name="first", notes="n0", tags=["t0"])
    run.log({"x": 1})
    report(seen=_set_and_read(run))
    run.log({"x": 2})
    run.finish()
    try:
        run.name = "after"
        report(finished=None)
    except Exception as exc:
        report(finished=[type(exc).__name__, str(exc).replace(run.id, "ID")])


def rank_sets(rank_q: Any) -> None:
    import wandb_funnel as wf

    run = wf.init()  # a spawn worker: attaches to the owner's funnel as a rank of its own
    seen = _set_and_read(run)
    run.log({"y": 1})
    rank_q.put({"rank": run.rank, **seen})
    run.finish()


@scenario()
def spawn_rank(args: argparse.Namespace) -> None:
    """The owner opens the run with wf.init; a spawn worker (rank 1) sets the attributes."""
    import wandb_funnel as wf

    run = wf.init(project="attributes", name="first", notes="n0", tags=["t0"])
    run.log({"x": 1})
    ctx = mp.get_context("spawn")
    rank_q = ctx.Queue()
    worker = ctx.Process(target=rank_sets, args=(rank_q,))
    worker.start()
    report(seen=rank_q.get(timeout=60))
    worker.join()
    run.log({"x": 2})
    run.finish()
    report(worker_exit=worker.exitcode)


# -- wandb's cross-validation example (examples/wandb-sweeps/sweeps-cross-validation), with
# two folds, without ``sweep_run.save()`` (wandb 0.31's save needs a pattern: plain raises)
# and without its last part (a resumed sweep run): workers started before
# wandb.init wait on queues while the sweep run sets its notes.
def train(sweep_q: Any, worker_q: Any) -> None:
    import wandb

    data = worker_q.get(timeout=60)  # bounded here: a parent that failed must not hang the test
    run = wandb.init(
        group=data["sweep_id"],
        job_type=data["sweep_run_name"],
        name=f"{data['sweep_run_name']}-{data['num']}",
        config=data["config"],
    )
    val_accuracy = random.random()
    run.log({"val_accuracy": val_accuracy})
    wandb.finish()
    sweep_q.put(val_accuracy)


@scenario()
def cross_validation(args: argparse.Namespace) -> None:
    import wandb

    folds = 2
    sweep_q: Any = mp.Queue()
    workers = []
    for _ in range(folds):
        q: Any = mp.Queue()
        p = mp.Process(target=train, kwargs={"sweep_q": sweep_q, "worker_q": q})
        p.start()
        workers.append((q, p))
    sweep_run = wandb.init(project="cross-validation", name="sweep")
    sweep_id = sweep_run.sweep_id or "unknown"
    sweep_run.notes = f"{sweep_run.project_url}/groups/{sweep_id}"  # wandb 0.31
    sweep_run_name = sweep_run.name or sweep_run.id or "unknown_2"
    sweep_run.finish()
    metrics = []
    for num, (q, p) in enumerate(workers):
        q.put(
            {
                "sweep_id": sweep_id,
                "num": num,
                "sweep_run_name": sweep_run_name,
                "config": dict(sweep_run.config),
            }
        )
        metrics.append(sweep_q.get(timeout=120))
        p.join()
    report(folds=len(metrics), exits=[p.exitcode for _, p in workers], name=sweep_run_name)


if __name__ == "__main__":
    scenario.main()
