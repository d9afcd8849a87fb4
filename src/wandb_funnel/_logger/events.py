"""What the receiver's thread hands the loop, in the order it took it from the socket: a rank
attached, a batch of its records, an update (config, summary, console, files, ...), a rank
ended. Plain frozen data: the loop dispatches on the type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wandb_funnel._protocol.messages import Record, UpdateKind


@dataclass(frozen=True, slots=True)
class Attached:
    rank: int
    pid: int = 0  # the rank's process (the owner's pid tells the owner's rank)


@dataclass(frozen=True, slots=True)
class Records:
    rank: int
    records: list[Record]
    end_seq: int = 0  # one past the batch's last sequence number
    replayed: bool = False  # resent to this (restarted) logger: the run may have some


@dataclass(frozen=True, slots=True)
class Update:
    rank: int
    kind: UpdateKind
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ended:
    """A rank finished (said goodbye, with its exit code) or is gone (died)."""

    rank: int
    gone: bool
    exit_code: int = 0


Event = Attached | Records | Update | Ended
