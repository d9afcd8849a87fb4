"""One run across a job's restarts: which job this is, which attempt of it, and which run
it continues.

A restarted job runs the same command again: torchrun under ``--max-restarts``
(``TORCHELASTIC_RUN_ID``, the same for every restart of one torchrun; and
``TORCHELASTIC_RESTART_COUNT``), a SLURM requeue (``SLURM_JOB_ID``, or
``SLURM_ARRAY_JOB_ID``/``SLURM_ARRAY_TASK_ID`` for an array task; and
``SLURM_RESTART_COUNT``). Plain wandb makes a new run each time. Here the run's id is derived
from the job and the training (the program and its arguments, the project, name and group),
so every attempt of one training finds the same run and continues it (``resume="allow"``):
a new segment, ``_step`` going on past the earlier ones (``_logger/loop.py``). Two trainings
in one allocation (a sweep, two ``srun`` steps with other arguments or another name) derive
other ids and never merge; the same training run again within one attempt, after the first
finished, gets a run of its own too.

The user's own id (``id=``, ``WANDB_RUN_ID``) is continued the same way when a run of that id
is on disk already. ``restarts="new"`` (``WANDB_FUNNEL_RESTARTS=new``, ``--restarts new``)
turns all of this off.

What each attempt did is kept beside the runs, in ``<wandb dir>/funnel-attempts/<id>.json``
(written by the logger: "running" as the run opens, "done" with its exit code as it is
finished; an attempt killed outright stays "running", and the next one continues it).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_DIR = "funnel-attempts"
CONTINUE, NEW = "continue", "new"  # the ``restarts`` option's values


class Job(NamedTuple):
    """A job as its launcher or scheduler names it, and its restart count."""

    name: str  # "SLURM job 123", "SLURM job 123_4" (an array task), "torchrun run <id>"
    restart: int  # its restart count: SLURM's, else torchrun's
    # What orders its attempts: a requeue restarts torchrun inside it too (whose count then
    # starts again), so SLURM's count first, then torchrun's.
    order: int


class Attempt(NamedTuple):
    """This process's run, as one attempt of a job: plain data for the logger's start."""

    run_id: str
    job: str  # what to call the job on the terminal
    restart: int  # the job's restart count now (0: the first run of it)
    order: int  # what orders the job's attempts (``Job.order``)
    number: int  # the attempts of this run so far, this one included (1: a new run)
    segments: list[str]  # the earlier attempts' transaction logs, oldest first
    root: str  # the wandb directory the run is in (its ``funnel-attempts`` too)

    @property
    def continues(self) -> bool:
        return self.number > 1

    def to_wire(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_wire(cls, data: Any) -> Attempt | None:
        if data is None:
            return None
        return cls(
            str(data["run_id"]),
            str(data["job"]),
            int(data["restart"]),
            int(data["order"]),
            int(data["number"]),
            [str(s) for s in data["segments"]],
            str(data["root"]),
        )

    def said(self) -> str:
        """The line the terminal and the run's console get when the run is continued."""
        return (
            f"continuing run {self.run_id}: restart {self.restart} of {self.job} "
            f"(attempt {self.number} of this run)"
        )


def job_of(environ: Mapping[str, str]) -> Job | None:
    """The job a scheduler or launcher says this is, or None (a plain process)."""
    restart = _int(environ.get("TORCHELASTIC_RESTART_COUNT"))
    slurm = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    if slurm:
        task = environ.get("SLURM_ARRAY_TASK_ID") if environ.get("SLURM_ARRAY_JOB_ID") else None
        name = f"SLURM job {slurm}_{task}" if task else f"SLURM job {slurm}"
        slurm_restart = _int(environ.get("SLURM_RESTART_COUNT"))
        return Job(name, slurm_restart, slurm_restart * 1000 + restart)
    if environ.get("TORCHELASTIC_RUN_ID"):
        return Job(f"torchrun run {environ['TORCHELASTIC_RUN_ID']}", restart, restart)
    return None


def wandb_root(init_kwargs: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """The directory wandb puts the run's files in (``<dir>/wandb``), as wandb.init finds it."""
    base = init_kwargs.get("dir") or environ.get("WANDB_DIR") or os.getcwd()
    return os.path.join(os.path.abspath(os.fspath(base)), "wandb")


def training_key(job: Job, init_kwargs: Mapping[str, Any], argv: list[str]) -> str:
    """What tells one training of a job from another: the job, the program and its
    arguments, and the run's project, name and group."""
    named = {k: init_kwargs.get(k) for k in ("project", "entity", "name", "group", "job_type")}
    return json.dumps([job.name, [os.path.abspath(argv[0]) if argv else "", *argv[1:]], named])


def derived_id(key: str, k: int) -> str:
    """An 8-character id like wandb's, the same for the same training every time."""
    digest = int.from_bytes(hashlib.sha256(f"{key}#{k}".encode()).digest(), "big")
    out = []
    for _ in range(8):
        digest, i = divmod(digest, len(_ALPHABET))
        out.append(_ALPHABET[i])
    return "".join(out)


def plan(
    init_kwargs: Mapping[str, Any],
    restarts: str,
    environ: Mapping[str, str] | None = None,
    argv: list[str] | None = None,
) -> Attempt | None:
    """This run as an attempt of a job: its id (``init_kwargs["id"]`` when given, else one
    derived from the job), and whether it continues an earlier attempt. None: nothing to
    continue (``restarts="new"``, or neither a job nor an id).
    """
    if restarts == NEW:
        return None
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    root = wandb_root(init_kwargs, environ)
    job = job_of(environ)
    given = init_kwargs.get("id")
    if given is not None:
        state = _read(root, str(given))
        segments = segments_of(root, str(given))
        number = int(state.get("number", 0)) + 1 if state else (2 if segments else 1)
        job = job or Job(f"run {given}", number - 1, number - 1)
        return Attempt(str(given), job.name, job.restart, job.order, number, segments, root)
    if job is None:
        return None
    key = training_key(job, init_kwargs, argv)
    for k in range(1000):
        run_id = derived_id(key, k)
        state = _read(root, run_id)
        order = int(state.get("order", -1))
        # New; or a later restart of the job, or one that never finished (killed outright).
        if not state or job.order > order or (job.order == order and state.get("state") != "done"):
            number = int(state.get("number", 0)) + 1
            segments = segments_of(root, run_id)
            return Attempt(run_id, job.name, job.restart, job.order, number, segments, root)
        # Finished in this very attempt (or an older restart count): another training.
    return None


def segments_of(root: str, run_id: str) -> list[str]:
    """The transaction logs of ``run_id`` in ``root``, oldest first: wandb names each run
    directory by its start time, ``offline-run-YYYYmmdd_HHMMSS-<id>`` (``run-...`` online),
    and a second one in the same second ``...-<id>-1``, ``-2``, ..."""
    named = re.compile(rf"(?:offline-)?run-(\d{{8}}_\d{{6}})-{re.escape(run_id)}(?:-(\d+))?")
    found = []
    for path in glob.glob(os.path.join(glob.escape(root), "*", f"run-{run_id}.wandb")):
        match = named.fullmatch(os.path.basename(os.path.dirname(path)))
        if match:
            found.append((match.group(1), int(match.group(2) or 0), path))
    return [path for _, _, path in sorted(found)]


def record(attempt: Attempt, state: str, exit_code: int | None = None) -> None:
    """Write what this attempt did ("running" as the run opens, "done" as it closes);
    never raises (a read-only directory costs only the continuation of a later attempt)."""
    data = {
        "run_id": attempt.run_id,
        "job": attempt.job,
        "restart": attempt.restart,
        "order": attempt.order,
        "number": attempt.number,
        "state": state,
        "exit_code": exit_code,
        "pid": os.getpid(),
        "time": time.time(),
    }
    directory = os.path.join(attempt.root, _DIR)
    path = os.path.join(directory, f"{attempt.run_id}.json")
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


def _read(root: str, run_id: str) -> dict[str, Any]:
    try:
        with open(os.path.join(root, _DIR, f"{run_id}.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _int(text: str | None) -> int:
    try:
        return max(0, int(text or 0))
    except ValueError:
        return 0
