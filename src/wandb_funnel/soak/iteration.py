"""What one soak iteration did and what its checks found (``Iteration``): the harness fills
it in, the report reads it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Iteration"]


@dataclass
class Iteration:
    scenario: str
    index: int
    seed: str
    plain: bool = False
    directory: str = ""
    hang: bool = False
    owner_exit: int | None = None
    run_exits: list[int | None] = field(default_factory=list)
    exit_s: float | None = None  # end of training (or the fault) to every process gone
    sent: int = 0
    logged: int = 0
    dropped: int = 0
    lost: int = 0  # negative: records in flight when a signal hit (see probe.attempt)
    lost_reason: str | None = None
    fault_done: bool = False
    fault_after_end: bool = False  # it landed after the program's last line (program_end)
    known_abort: bool = False  # a process died of Scenario.known_abort (a dependency's bug)
    closing_before_fault: bool = False  # see Scenario.run_exit_if_closing
    leftover_processes: list[str] = field(default_factory=list)
    leftover_sockets: list[str] = field(default_factory=list)
    wandb_sockets: list[str] = field(default_factory=list)  # wandb-core's, see check_sockets
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    rates: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fault: str | None = None  # the scenario's fault action
    command: list[str] = field(default_factory=list)
    fault_at_s: float | None = None  # when the fault landed, seconds after the start
    duration_s: float | None = None  # start to every process of the job gone
    probe_used: bool = False  # the program wrote probe events or counts: records balanced
    runs: list[dict[str, Any]] = field(default_factory=list)  # what each .wandb file says
    grace_killed: list[str] = field(default_factory=list)  # role:pid the grace's SIGKILL hit
    mark: str = ""  # the job's marker (jobenv.MARK_VAR): finds its processes
    aborted: bool = False  # the soak was aborted (a second Ctrl-C): killed, not judged

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}
