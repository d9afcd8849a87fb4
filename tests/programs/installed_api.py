"""Plain wandb code run with ``wandb_funnel.install()`` (or, with ``--plain``, without it), so
that a test can compare the two runs as wandb wrote them.

    python installed_api.py SCENARIO [--plain]      (``--help`` lists them)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing as mp
import os
from collections.abc import Callable
from typing import Any

from _prelude import Scenarios, option, report

scenario = Scenarios(__doc__)
plain = option("--plain", action="store_true", help="plain wandb: no install()")


def _install(args: argparse.Namespace) -> None:
    if not args.plain:
        import wandb_funnel

        wandb_funnel.install()


def log_sequence(wandb: Any) -> None:
    """The same calls in both runs: implicit steps, explicit steps, commit=False merges."""
    wandb.log({"a": 1})
    wandb.log({"a": 2, "b": 1})
    wandb.log({"c": 1}, commit=False)
    wandb.log({"a": 3})  # merges with c
    wandb.log({"a": 4}, step=10)
    wandb.log({"b": 2}, step=10)  # the same step: one row
    wandb.log({"a": 5}, step=12, commit=True)
    wandb.log({"a": 6})  # after a committed explicit step: the next one


@scenario(plain)
def surface(args: argparse.Namespace) -> None:
    """Every API call the survey names, through the module and the run."""
    _install(args)
    wandb: Any = importlib.import_module("wandb")  # typed as Any: wandb's API is untyped
    report(run_before=wandb.run is None)
    run = wandb.init(
        project="surface",
        name="surface-run",
        id=None,
        entity=None,
        group="g1",
        job_type="train",
        notes="some notes",
        tags=("t1", "t2"),
        config={"id2label": {0: "neg", 1: "pos"}, "lr": 0.1},
        settings=wandb.Settings(x_stats_sampling_interval=5),
        reinit=None,
        resume=None,
        mode=None,
    )
    report(
        same_run=wandb.run is run,
        is_wandb_run=isinstance(run, wandb.sdk.wandb_run.Run),
        name=run.name,
        project=run.project,
        group=run.group,
        job_type=run.job_type,
        notes=run.notes,
        tags=list(run.tags),
        dir_exists=os.path.isdir(run.dir),
        url=run.url,
        id_in_path=run.path.endswith(run.id),
    )
    wandb.config.update({"batch": 8}, allow_val_change=True)
    run.config["model/num_parameters"] = 1234
    wandb.config.setdefaults({"batch": 99, "seed": 7})
    try:
        wandb.config.update({"lr": 0.2})
        changed = "no error"
    except Exception as exc:
        changed = type(exc).__name__
    report(
        change_without_allow=changed,
        config_get=wandb.config.get("model/num_parameters"),
        config_attr=wandb.config.lr,
        int_keys=wandb.config.id2label,
    )
    wandb.define_metric("train/step")
    wandb.define_metric("train/*", step_metric="train/step")
    log_sequence(wandb)
    for i in range(3):
        wandb.log({"train/loss": 1.0 / (i + 1), "train/step": 100 + i})
    wandb.summary["best"] = 0.9
    run.summary.update({"final": 1})
    wandb.termlog("a termlog line")
    wandb.termwarn("a termwarn line")
    wandb.finish(exit_code=0)
    report(run_after=wandb.run is None)
    # Calls on the finished run raise what wandb raises, worded as wandb words them.
    refused = {}
    calls: list[tuple[str, Callable[[], object]]] = [
        ("log", lambda: run.log({"late": 1})),
        ("config", lambda: run.config.update({"late": 1})),
        ("summary", lambda: run.summary.update({"late": 1})),
        ("define_metric", lambda: run.define_metric("late")),
    ]
    for name, call in calls:
        try:
            call()
            refused[name] = "nothing raised"
        except wandb.errors.UsageError as exc:
            refused[name] = str(exc).replace(run.id, "ID")
    report(finished_calls=refused)


def child(n: int) -> bool:
    import wandb

    wandb.init()  # finds the owner's funnel: one run
    wandb.log({"child": n}, step=n)
    wandb.finish()
    return hasattr(wandb.init, "__wandb_funnel_original__")


class Probe:
    """A map-style dataset whose items say whether wandb is installed in the worker."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> bool:
        import wandb

        return hasattr(wandb.init, "__wandb_funnel_original__")


@scenario()
def children(args: argparse.Namespace) -> None:
    """install() holds in spawn, forkserver and fork children, and in DataLoader workers."""
    import wandb_funnel

    wandb_funnel.install()
    import torch
    import wandb

    wandb.init(project="children")
    installed: dict[str, list[bool]] = {}
    loader: Any = torch.utils.data.DataLoader(
        Probe(),  # type: ignore[arg-type]  # map-style: __getitem__ and __len__ are enough
        num_workers=1,
        multiprocessing_context="spawn",
        batch_size=None,
    )
    # Every child starts (and imports wandb, which is where install() takes hold) at once,
    # side by side; they log one kind after another, so that their steps come in order.
    with contextlib.ExitStack() as pools:
        started = {
            method: pools.enter_context(
                mp.get_context(method).Pool(
                    1, initializer=importlib.import_module, initargs=("wandb",)
                )
            )
            for method in ("fork", "spawn", "forkserver")  # fork before any pool's threads
        }
        items = iter(loader)  # its worker starts and fetches now, logging nothing
        for i, method in enumerate(("spawn", "forkserver", "fork")):
            # one child of each kind, twice: each kind's child once, and a child that logs again
            installed[method] = started[method].map(child, range(i * 10, i * 10 + 2))
        installed["dataloader-spawn"] = [bool(b) for b in items]
    report(installed=installed)
    wandb.finish()


def spawned_rank(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist
    import wandb

    dist.init_process_group("gloo", rank=rank, world_size=world)
    wandb.init(project="spawn", name="spawned")  # every rank: one run, through the group
    for step in range(5):
        dist.all_reduce(torch.ones(1))  # a training step's collective: ranks in lockstep
        wandb.log({"loss": float(rank * 10 + step)})
    wandb.finish()
    dist.destroy_process_group()


@scenario()
def mp_spawn(args: argparse.Namespace) -> None:
    """torch.multiprocessing.spawn: ranks with no launcher variables, only a process group."""
    import wandb_funnel

    wandb_funnel.install(reduce={"loss": "sum"})
    import socket

    spawn: Any = importlib.import_module("torch.multiprocessing").spawn  # untyped
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    spawn(spawned_rank, args=(2,), nprocs=2, join=True)
    report(spawned=True)


if __name__ == "__main__":
    scenario.main()
