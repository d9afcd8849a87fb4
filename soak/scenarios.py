"""The project's own fault matrix: which program runs, what the harness does to it, and what
must hold afterwards. Run it with

    wandb-funnel soak --matrix soak/scenarios.py [--iterations N | --minutes M] [--jobs J]

(``tox -e soak`` runs a long one; ``tests/soak/test_soak.py`` a short one in CI). The types,
the fault actions and the harness are the package's (``wandb_funnel.soak``); the programs are
in ``programs/`` beside this file, each a script a user could have written, reporting through
``wandb_funnel.soak.probe``.

A scenario's expectations are the documented behaviour (docs/guide/lifecycle.md,
"Lifecycle guarantees"):
- ``owner_exit``: the return codes the owner (or torchrun) may end with;
- ``run_exit``: the exit code the ``.wandb`` file's exit record must carry, or ``None`` when
  the fault takes the logger or wandb-core down, so that no exit record can be written;
- ``may_lose``: why records may be missing from the run; ``None`` means every record sent
  must be logged or counted as dropped.
"""

from __future__ import annotations

import pathlib

from wandb_funnel.soak.scenarios import Fault, Scenario

# The harness resolves each scenario's ``program`` (and ``plain``) in this directory.
PROGRAMS = pathlib.Path(__file__).resolve().parent / "programs"

_KILLED_WORKER = "a SIGKILLed worker loses the records still in its unsent batch"
_SIGINT = (130, -2, 1)  # KeyboardInterrupt ends Python by re-raising SIGINT (-2)
_SIGTERM = (143, -15)

SCENARIOS: list[Scenario] = [
    Scenario("pool-spawn", "spawn Pool, normal exit", "pool.py", ("--method", "spawn")),
    Scenario("pool-fork", "fork Pool, normal exit", "pool.py", ("--method", "fork")),
    Scenario(
        "pool-terminate",
        "Pool terminated by its context manager mid-logging",
        "pool.py",
        ("--method", "spawn", "--ending", "terminate"),
    ),
    Scenario(
        "worker-raises",
        "an exception in a Pool worker reaches the owner",
        "pool.py",
        ("--method", "spawn", "--ending", "worker-raise"),
        owner_exit=(1,),
        run_exit=1,
    ),
    Scenario(
        "owner-raises",
        "an exception in the owner while workers log",
        "pool.py",
        ("--method", "fork", "--ending", "owner-raise"),
        owner_exit=(1,),
        run_exit=1,
    ),
    Scenario(
        "no-close",
        "the owner exits without close()/finish()",
        "pool.py",
        ("--method", "spawn", "--ending", "no-close"),
    ),
    Scenario(
        "ctrl-c",
        "SIGINT to the owner's process group mid-run (Ctrl-C)",
        "processes.py",
        owner_exit=_SIGINT,
        run_exit=130,
        fault=Fault("sigint-group"),
        run_exit_if_closing=0,
    ),
    Scenario(
        "preempted",
        "SIGTERM to the job, SIGKILL after a grace period (SLURM, k8s)",
        "processes.py",
        owner_exit=_SIGTERM,
        run_exit=143,
        fault=Fault("preempt", grace=(8.0, 12.0)),
        run_exit_if_closing=0,
    ),
    Scenario(
        "worker-killed",
        "SIGKILL to one worker mid-run",
        "processes.py",
        fault=Fault("kill-worker", ends_training=False),
        may_lose=_KILLED_WORKER,
    ),
    # The owner starts a new logger, which continues the run; the ranks resend what was not
    # saved: nothing may be lost (issue 26).
    Scenario(
        "logger-killed",
        "SIGKILL to the logger mid-run: training goes on, a new logger continues the run",
        "processes.py",
        fault=Fault("kill-logger", ends_training=False),
    ),
    Scenario(
        "logger-killed-3x",
        "SIGKILL to the logger three times in one job",
        "processes.py",
        ("--steps", "3000"),
        deadline=180,
        fault=Fault("kill-logger", delay=(0.5, 2.0), ends_training=False, times=3),
    ),
    Scenario(
        "wandb-core-killed",
        "SIGKILL to the run's wandb-core mid-run: a new logger (and core) continues the run",
        "processes.py",
        fault=Fault("kill-wandb-core", ends_training=False),
    ),
    Scenario(
        "torchrun-logger-killed",
        "torchrun, 4 ranks: SIGKILL to the logger mid-run",
        "ddp.py",
        ("--steps", "1500"),
        torchrun=4,
        needs=("torch",),
        deadline=150,
        fault=Fault("kill-logger", ends_training=False),
    ),
    Scenario(
        "two-nodes",
        "two torchrun agents as two nodes, 2 ranks each: node 1 through its node logger",
        "two_nodes.py",
        ("2",),
        needs=("torch",),
        deadline=150,
    ),
    Scenario(
        "two-nodes-node-logger-killed",
        "two nodes, 2 ranks each: SIGKILL to node 1's node logger mid-run",
        "two_nodes.py",
        ("2", "--steps", "1500"),
        needs=("torch",),
        deadline=180,
        fault=Fault("kill-node-logger", ends_training=False),
    ),
    Scenario(
        "sink-behind",
        "workers log flat out, far faster than wandb writes rows",
        "flood.py",
        deadline=120,
    ),
    Scenario(
        "sink-stalls",
        "workers log flat out while wandb-core is stopped for seconds",
        "flood.py",
        deadline=120,
        fault=Fault("stall-wandb-core", delay=(0.5, 1.5), grace=(2.0, 4.0), ends_training=False),
    ),
    Scenario(
        "torchrun",
        "torchrun, 2-4 ranks, normal exit",
        "ddp.py",
        torchrun=-1,
        needs=("torch",),
        deadline=120,
    ),
    Scenario(
        "torchrun-rank-raises",
        "torchrun, one rank raises",
        "ddp.py",
        ("--raise-rank", "1"),
        torchrun=-1,
        needs=("torch",),
        deadline=120,
        owner_exit=(1,),
        run_exit=1,
    ),
    Scenario(
        "torchrun-sigterm",
        "SIGTERM to torchrun mid-run",
        "ddp.py",
        torchrun=-1,
        needs=("torch",),
        deadline=120,
        owner_exit=(1, *_SIGTERM),
        run_exit=143,
        fault=Fault("sigterm-owner", delay=(0.0, 1.0)),
        run_exit_if_closing=0,
        closing_window=0.3,
    ),
    Scenario(
        "torchrun-rank-killed",
        "SIGKILL to one rank (not rank 0) mid-run",
        "ddp.py",
        torchrun=-1,
        needs=("torch",),
        deadline=120,
        owner_exit=(1,),
        run_exit=143,
        fault=Fault("kill-worker", delay=(0.0, 1.0)),
        may_lose=_KILLED_WORKER,
        run_exit_if_closing=0,
        closing_window=60.0,
    ),
    # Public reports of hangs and losses (programs/REPORTS.md): each runs through the funnel,
    # and ``plain`` is the reporter's program with today's wandb, run beside it for the table.
    Scenario(
        "report-wandb2233",
        "wandb/wandb#2233: mp.spawn, rank 0 logs, no finish",
        "report_wandb2233_funnel.py",
        needs=("torch",),
        deadline=120,
        plain="report_wandb2233_plain.py",
        # torch gloo + CPython 3.11 at interpreter exit (REPORTS.md): 7/35 runs with no
        # wandb at all; destroy_process_group() makes it rare, not impossible.
        known_abort="terminate called without an active exception",
    ),
    Scenario(
        "report-lightning6106",
        "Lightning#6106: ddp_spawn with a W&B logger",
        "report_lightning6106_funnel.py",
        needs=("torch",),
        deadline=120,
        plain="report_lightning6106_plain.py",
    ),
    Scenario(
        "report-fairseq4619",
        "fairseq#4619: multi-GPU DDP never calls finish",
        "report_fairseq4619_funnel.py",
        torchrun=2,
        needs=("torch",),
        deadline=120,
        plain="report_fairseq4619_plain.py",
        # Like fairseq, the program never calls destroy_process_group(): a rank can die
        # of the same torch gloo + CPython 3.11 exit abort as report-wandb2233
        # (REPORTS.md; seen once in a fresh-clone CI run: rank 1 -6, torchrun exit 1).
        known_abort="terminate called without an active exception",
    ),
    Scenario(
        "report-yolov5-5160",
        "yolov5#5160: destroy_process_group() at the end",
        "report_yolov5_5160_funnel.py",
        torchrun=2,
        needs=("torch",),
        deadline=120,
        plain="report_yolov5_5160_plain.py",
    ),
    Scenario(
        "report-wandb9963",
        "wandb/wandb#9963: scancel signals every process, wandb-core too",
        "report_wandb9963_funnel.py",
        deadline=120,
        needs=("torch",),
        owner_exit=(143, -9),
        run_exit=None,
        fault=Fault("scancel", delay=(0.5, 2.0), grace=(5.0, 10.0)),
        may_lose="scancel stops wandb-core too: rows it had not flushed (about 1 s) are lost",
        plain="report_wandb9963_plain.py",
    ),
    Scenario(
        "report-wandb7590",
        "wandb/wandb#7590: finish() inside a SIGTERM handler",
        "report_wandb7590_funnel.py",
        needs=("torch",),
        deadline=120,
        owner_exit=(143,),
        fault=Fault("sigterm-owner", delay=(0.3, 1.5)),
        plain="report_wandb7590_plain.py",
    ),
    Scenario(
        "report-wandb919",
        "wandb/wandb#919: offline on a cluster, the job must end",
        "report_wandb919_funnel.py",
        needs=("torch",),
        deadline=120,
        plain="report_wandb919_plain.py",
    ),
    Scenario(
        "dataloader-fork",
        "DataLoader workers forked from ranks that already logged",
        "ddp.py",
        ("--loader-workers", "2"),
        torchrun=2,
        needs=("torch",),
        deadline=120,
    ),
]
