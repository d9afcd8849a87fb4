"""What the harness runs: a scenario is a program (or a user's command), a fault to inject,
and what must hold afterwards.

Two sources of scenarios:
- a *matrix file*, a Python file that defines ``SCENARIOS`` (a list of ``Scenario``) and
  optionally ``PROGRAMS`` (the directory its program names are relative to; default: the
  file's own directory), loaded by ``load_matrix``. The project's own matrix is
  ``soak/scenarios.py`` in its repository (``wandb-funnel soak --matrix soak/scenarios.py``);
- a *user's command* (``wandb-funnel soak -- python train.py``): ``user_matrix`` builds one
  scenario per fault of ``USER_FAULTS``, whose exit codes are reported, not judged.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import pathlib
from dataclasses import dataclass, field, replace

# Fault actions the harness knows (see faults.FaultInjector):
#   sigint-group      Ctrl-C in a terminal: SIGINT to the owner's process group
#   preempt           SIGTERM to the owner's group, then SIGKILL to it after ``grace`` s
#   scancel           SIGTERM to every process of the job (logger and wandb-core too), then
#                     SIGKILL to every one still alive after ``grace`` s
#   sigterm-owner     SIGTERM to the owner only (torchrun, or a user's own handler)
#   kill-worker       SIGKILL to one worker: one that said ``worker`` through the probe
#                     (rank > 0 for torchrun); with ``needs_probe=False`` and no such
#                     announcement, any process of the job but the owner, the logger,
#                     wandb-core and multiprocessing's helper processes
#   kill-logger       SIGKILL to the logger process
#   kill-wandb-core   SIGKILL to wandb-core
#   kill-node-logger  SIGKILL to a node logger (a job on several nodes: the node tier)
#   stall-wandb-core  SIGSTOP wandb-core for ``grace`` s, then SIGCONT: a sink that stalls
ACTIONS = (
    "sigint-group",
    "preempt",
    "scancel",
    "sigterm-owner",
    "kill-worker",
    "kill-logger",
    "kill-wandb-core",
    "kill-node-logger",
    "stall-wandb-core",
)


@dataclass(frozen=True)
class Fault:
    action: str
    delay: tuple[float, float] = (1.0, 3.0)  # random delay after the program said ready
    grace: tuple[float, float] = (0.0, 0.0)
    ends_training: bool = True  # exit time is counted from the fault, not from train_end
    # True: the program reports through the probe; the delay counts from its ``ready``
    # event (no ``ready``, no fault). False (a user's command): the delay counts from the
    # start, unless the program turns out to use the probe (it wrote an event), in which case
    # the ``ready`` rule applies after all.
    needs_probe: bool = True
    # How many times the fault is injected in one job: each later one after a new random
    # delay, and only at a process not hit before (kill-logger: a restarted logger).
    times: int = 1

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}; known: {', '.join(ACTIONS)}")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    program: str = ""  # a script, run as ``python program *args`` (or under torchrun)
    args: tuple[str, ...] = ()
    torchrun: int = 0  # ranks under torchrun --standalone; 0 runs ``python program``
    # Generous: a loaded 2-core machine stretches a 5 s program past 60 s. A hang still fails.
    deadline: float = 120.0
    # The return codes the owner may end with; ``None``: reported, not judged (a user's
    # command: its own handlers decide them).
    owner_exit: tuple[int, ...] | None = (0,)
    run_exit: int | None = 0
    fault: Fault | None = None
    may_lose: str | None = None
    needs: tuple[str, ...] = ()
    plain: str | None = None  # the plain-wandb program a public report describes
    # Also accepted when the fault lands after the program said ``run_closing`` (the run's
    # host was already closing it with this code; signals are held, not lost, meanwhile).
    run_exit_if_closing: int | None = None
    # How long after the fault a ``run_closing`` still counts: torchrun notices a dead rank
    # only on its next poll, and rank 0 may finish the run with 0 before it is stopped; a
    # SIGTERM to torchrun reaches the ranks only when torchrun forwards it (soak x1 #30: rank 0
    # began closing 1 ms after the signal to torchrun, 4 ms before torchrun forwarded it).
    closing_window: float = 0.0
    runs: int = 1  # how many .wandb runs the job writes
    # A dependency's own crash, root-caused and reproduced without wandb at all: a wrong owner
    # exit code with this text in the job's stderr is counted apart ("known aborts"), and the
    # iteration still has to pass every other check.
    known_abort: str | None = None
    tags: tuple[str, ...] = field(default=())
    # A whole command line run as it is (a user's ``python train.py ...`` or
    # ``torchrun ... train.py``) instead of ``program``, ``args`` and ``torchrun``.
    command: tuple[str, ...] = ()
    # Why records may be missing when the SIGKILL that ends a grace period (preempt,
    # scancel) reached a process of the job: it outlived the grace it was given.
    may_lose_if_killed: str | None = None


def select(scenarios: list[Scenario], patterns: list[str] | None) -> list[Scenario]:
    """Scenarios whose name matches any of ``patterns`` (globs); all of them when empty."""
    if not patterns:
        return list(scenarios)
    chosen = [s for s in scenarios if any(fnmatch.fnmatch(s.name, p) for p in patterns)]
    if not chosen:
        names = ", ".join(s.name for s in scenarios)
        raise ValueError(f"no scenario matches {patterns!r}; known: {names}")
    return chosen


def load_matrix(path: os.PathLike[str] | str) -> list[Scenario]:
    """The ``SCENARIOS`` a Python file defines, each ``program`` and ``plain`` made an
    absolute path (relative ones are resolved in the file's ``PROGRAMS`` directory, or in
    the file's own directory when it defines none)."""
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise ValueError(f"no matrix file {path}")
    spec = importlib.util.spec_from_file_location(f"_wandb_funnel_soak_matrix_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {path} as a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scenarios = getattr(module, "SCENARIOS", None)
    if not isinstance(scenarios, list) or not all(isinstance(s, Scenario) for s in scenarios):
        raise ValueError(f"{path} must define SCENARIOS, a list of {__name__}.Scenario")
    names = [s.name for s in scenarios]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: scenario names used twice: {', '.join(duplicates)}")
    base = pathlib.Path(getattr(module, "PROGRAMS", path.parent))

    def resolve(program: str) -> str:
        return str(base / program)  # an absolute ``program`` stays as it is

    return [
        replace(
            s,
            program=resolve(s.program) if s.program else s.program,
            plain=resolve(s.plain) if s.plain else s.plain,
        )
        for s in scenarios
    ]


# The faults ``wandb-funnel soak -- COMMAND`` injects into a user's command, by name.
USER_FAULTS: dict[str, tuple[str | None, str]] = {
    "none": (None, "no fault: the program runs to its end (the baseline)"),
    "ctrl-c": ("sigint-group", "SIGINT to the owner's process group (Ctrl-C in a terminal)"),
    "preempt": ("preempt", "SIGTERM to the owner's group, SIGKILL to it after the grace"),
    "sigterm-owner": ("sigterm-owner", "SIGTERM to the owner only (a launcher, your handler)"),
    "kill-worker": ("kill-worker", "SIGKILL to a process not the owner/logger/wandb-core"),
    "kill-logger": ("kill-logger", "SIGKILL to the funnel's logger process"),
    "kill-wandb-core": ("kill-wandb-core", "SIGKILL to wandb-core"),
    "stall-wandb-core": ("stall-wandb-core", "SIGSTOP to wandb-core, SIGCONT after the grace"),
    "scancel": ("scancel", "SIGTERM to every process of the job, SIGKILL after the grace"),
}
# Faults that destroy records by their nature: losses are reported with this reason, not
# failed (when the program reports through the probe; otherwise nothing is counted).
_USER_LOSSES = {
    "kill-worker": "a SIGKILLed process loses the records still in its unsent batch",
    "kill-logger": "the logger was killed: rows not yet flushed by wandb-core are lost",
    "kill-wandb-core": "wandb-core was killed: rows it had not written yet are lost",
    "scancel": "scancel stops wandb-core too: rows it had not flushed are lost",
}
_USER_GRACE_ACTIONS = ("preempt", "scancel", "stall-wandb-core")


def user_matrix(
    command: list[str] | tuple[str, ...],
    faults: list[str] | None = None,
    fault_after: tuple[float, float] = (2.0, 10.0),
    grace: tuple[float, float] = (10.0, 10.0),
    deadline: float = 300.0,
    wait_ready: bool = False,
) -> list[Scenario]:
    """One scenario per fault name (``USER_FAULTS``; all of them when ``faults`` is empty),
    each running ``command`` as it is. Exit codes and exit records are reported, not judged:
    a hang, a process or a funnel socket left behind fail an iteration, and so do records
    lost without a reason when the program counts what it sent through the probe.

    The fault lands ``fault_after`` seconds after the start, or after the program's probe
    ``ready`` event if it has written probe events by then; ``wait_ready``: always after
    ``ready`` (and a kill-worker fault only kills a pid that said ``worker``), as in the
    project's own matrix."""
    if not command:
        raise ValueError("no command to run")
    names = list(dict.fromkeys(faults)) if faults else list(USER_FAULTS)
    unknown = [n for n in names if n not in USER_FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(USER_FAULTS)}")
    scenarios = []
    for name in names:
        action, summary = USER_FAULTS[name]
        fault = None
        if action is not None:
            fault = Fault(
                action,
                delay=fault_after,
                grace=grace if action in _USER_GRACE_ACTIONS else (0.0, 0.0),
                needs_probe=wait_ready,
            )
        scenarios.append(
            Scenario(
                name,
                summary,
                command=tuple(command),
                deadline=deadline,
                owner_exit=None,
                run_exit=None,
                fault=fault,
                may_lose=_USER_LOSSES.get(name),
                may_lose_if_killed=(
                    "the job outlived the grace period: the SIGKILL that ended it cost the "
                    "records still in flight"
                    if name == "preempt"
                    else None
                ),
            )
        )
    return scenarios
